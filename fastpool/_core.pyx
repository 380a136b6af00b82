# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The shared-memory board: rings, slot words and waits, over one memfd.

    parent (pool.py)                               worker (_worker.py)
    ----------------                               -------------------
    push_task(slot, kind, id, bytes) --task ring--> pop_task(slot)   (sets slot.current
                                                     first, then advances the ring)
    poll_results() <------------result ring-------- push_result(slot, kind, id, aux, bytes)
    wait_results(): spin, then futex on board.done <- notify after each publish

Every ring has one producer and one consumer, and every word a dead process
could have been writing is either its own (its slot) or published last with a
release store, so a SIGKILL on any instruction leaves nothing held.  Waits
release the GIL, are bounded, and return on EINTR so Ctrl-C is seen.
"""

from libc.stdint cimport uint32_t, uint64_t, int64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize

from fastpool import errors

from fastpool._sys cimport (
    FP_AGAIN, FP_CORRUPT, FP_ERRNO, FP_INTR, FP_OK, FP_TIMEOUT, FP_TOOBIG, MAP_FAILED, MAP_NORESERVE,
    MAP_SHARED, PROT_READ, PROT_WRITE, close, errno, fp_a32, fp_a64, fp_add32_seqcst, fp_add64_relaxed,
    fp_load32_acquire, fp_load64_acquire, fp_load64_relaxed, fp_store32_release, fp_store64_release,
    fp_sub32_seqcst, fp_xchg32_acqrel, ftruncate, mmap, munmap, pread,
)

cdef extern from "fp_futex.h" nogil:
    ctypedef struct fp_event_t:
        pass
    int64_t fp_now_ns()
    void fp_event_kick(fp_event_t *e)

cdef extern from "fp_ring.h" nogil:
    ctypedef struct fp_rec_t:
        uint32_t len
        uint32_t kind
        uint64_t task_id
        uint64_t aux
    ctypedef struct fp_ring_t:
        fp_a64 head
        fp_a64 tail
        uint64_t capacity
        uint64_t pushed
    ctypedef struct fp_resv_t:
        pass
    uint64_t fp_ring_max_record(const fp_ring_t *r)
    int fp_ring_empty(fp_ring_t *r)
    void fp_ring_reset(fp_ring_t *r)
    int fp_ring_push(fp_ring_t *r, uint32_t kind, uint64_t task_id, uint64_t aux,
                     const void *payload, uint64_t len)
    int fp_ring_peek(fp_ring_t *r, fp_rec_t **rec, uint64_t *next)
    void fp_ring_release(fp_ring_t *r, uint64_t next)

cdef extern from "fp_board.h" nogil:
    ctypedef struct fp_board_t:
        uint64_t magic
        uint32_t version
        uint32_t nslots
        uint64_t ring_capacity
        uint64_t total_size
        fp_event_t done
        fp_a32 attention
        fp_a32 want
    ctypedef struct fp_slot_t:
        fp_a32 state
        fp_a32 pid
        fp_a32 generation
        fp_a64 current
        fp_a64 heartbeat
        fp_a64 served
        fp_a64 cancel_id
    int FP_SLOT_EMPTY, FP_SLOT_STARTING, FP_SLOT_READY, FP_SLOT_EXITING
    uint64_t FP_PAGE
    uint64_t fp_board_size(uint32_t nslots, uint64_t cap)
    int fp_board_init(fp_board_t *b, uint32_t nslots, uint64_t cap)
    int fp_board_check(const fp_board_t *b, uint64_t mapped)
    fp_slot_t *fp_board_slot(fp_board_t *b, uint32_t i)
    fp_ring_t *fp_board_ring(fp_board_t *b, uint32_t i, int dir)
    int fp_board_parent_has_work(fp_board_t *b)
    int fp_board_wait_results(fp_board_t *b, int64_t timeout_ns, int64_t spin_ns)
    int fp_ring_wait_data(fp_ring_t *r, fp_a32 *stop, int64_t timeout_ns, int64_t spin_ns)
    int fp_ring_wait_space(fp_ring_t *r, uint64_t seen_head, int64_t timeout_ns)
    void fp_board_notify_parent(fp_board_t *b)

SLOT_EMPTY = FP_SLOT_EMPTY
SLOT_STARTING = FP_SLOT_STARTING
SLOT_READY = FP_SLOT_READY
SLOT_EXITING = FP_SLOT_EXITING

DEF TASKS = 0
DEF RESULTS = 1


cdef int _check(int rc, str what) except -1:
    if rc == FP_OK:
        return 0
    if rc == FP_ERRNO:
        import os
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    if rc == FP_CORRUPT:
        raise errors.SegmentCorrupt(f"{what}: the shared board is corrupt or of another version")
    raise RuntimeError(f"{what}: status {rc}")


cdef inline int64_t _ns(double seconds) noexcept:
    if seconds <= 0:
        return 0
    if seconds > 3600.0:
        seconds = 3600.0
    return <int64_t>(seconds * 1e9)


cdef class Board:
    """A mapping of one pool's board.  The parent creates it; workers attach by fd.

    Thread safety: the parent serialises producers of a task ring (pool lock)
    and consumers of the result rings (the drive lock); everything else is
    atomic.  Closing while another thread uses the board is the caller's bug.
    """

    cdef fp_board_t *_b
    cdef size_t _size
    cdef int _fd
    cdef readonly int nslots
    cdef readonly uint64_t ring_capacity
    cdef readonly uint64_t max_record
    cdef int _next_poll

    def __cinit__(self):
        self._b = NULL
        self._fd = -1

    @staticmethod
    def create(int nslots, uint64_t ring_capacity, str name="fastpool"):
        """Makes a fresh board in a new memfd (nothing appears in /dev/shm)."""
        import os
        cdef Board self = Board.__new__(Board)
        cdef uint64_t size = fp_board_size(nslots, ring_capacity)
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            if ftruncate(fd, <long>size) != 0:
                raise OSError(errno, f"cannot size the shared board to {size} bytes: {os.strerror(errno)}")
            self._map(fd, size)
        except BaseException:
            os.close(fd)
            raise
        _check(fp_board_init(self._b, nslots, ring_capacity), "board init")
        self._load_header()
        return self

    @staticmethod
    def attach(int fd):
        """Maps an existing board from an inherited fd (the fd stays the caller's)."""
        import os
        cdef Board self = Board.__new__(Board)
        cdef fp_board_t head
        if pread(fd, &head, sizeof(fp_board_t), 0) != sizeof(fp_board_t):
            raise errors.SegmentCorrupt("the shared board is too short to be one")
        if fp_board_check(&head, head.total_size if head.total_size < (1ULL << 46) else 0) != FP_OK:
            raise errors.SegmentCorrupt("the shared board's magic or layout version does not match "
                                        "this fastpool build")
        self._map(os.dup(fd), head.total_size)
        _check(fp_board_check(self._b, self._size), "board attach")
        self._load_header()
        return self

    cdef _map(self, int fd, uint64_t size):
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
        if p == MAP_FAILED:
            import os
            raise OSError(errno, f"cannot map the shared board ({size} bytes): {os.strerror(errno)}")
        self._b = <fp_board_t *>p
        self._size = size
        self._fd = fd

    cdef _load_header(self):
        self.nslots = self._b.nslots
        self.ring_capacity = self._b.ring_capacity
        self.max_record = fp_ring_max_record(fp_board_ring(self._b, 0, TASKS))

    def fileno(self):
        return self._fd

    @property
    def closed(self):
        return self._b == NULL

    @property
    def size(self):
        return self._size

    def close(self):
        """Unmaps and closes the fd.  Idempotent."""
        if self._b != NULL:
            munmap(self._b, self._size)
            self._b = NULL
        if self._fd >= 0:
            close(self._fd)
            self._fd = -1

    def __dealloc__(self):
        if self._b != NULL:
            munmap(self._b, self._size)
        if self._fd >= 0:
            close(self._fd)

    cdef inline int _ok(self, int slot) except -1:
        if self._b == NULL:
            raise errors.PoolClosed("the pool's shared board is closed")
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"slot {slot} out of range")
        return 0

    # ---- parent side -------------------------------------------------------------

    cpdef bint push_task(self, int slot, uint32_t kind, uint64_t task_id, bytes payload) except -1:
        """Publishes a task record; False if the ring is full right now."""
        self._ok(slot)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
        cdef int rc = fp_ring_push(fp_board_ring(self._b, slot, TASKS), kind, task_id, 0,
                                   PyBytes_AS_STRING(payload), n)
        if rc == FP_AGAIN:
            return False
        if rc == FP_TOOBIG:
            raise errors.SerializationError(
                f"task {task_id}", f"its pickle is {n} bytes, over the ring limit of "
                f"{self.max_record} bytes; pass large arrays through pool.share() or raise "
                f"Pool(ring_bytes=...)")
        _check(rc, "push task")
        return True

    cpdef list poll_results(self, int max_records=512):
        """Takes up to max_records published results, round-robin over slots.

        Returns [(slot, kind, task_id, aux, payload bytes)].  Only one thread
        may poll at a time (the pool's drive lock)."""
        if self._b == NULL:
            return []
        cdef list out = []
        cdef int n = self.nslots, i, s, start = self._next_poll
        cdef fp_ring_t *r
        cdef fp_rec_t *rec
        cdef uint64_t nxt
        cdef bint progress = True
        while progress and len(out) < max_records:
            progress = False
            for i in range(n):
                s = (start + i) % n
                r = fp_board_ring(self._b, s, RESULTS)
                if fp_ring_peek(r, &rec, &nxt) != FP_OK:
                    continue
                payload = PyBytes_FromStringAndSize(<char *>rec + sizeof(fp_rec_t), rec.len)
                out.append((s, rec.kind, rec.task_id, rec.aux, payload))
                fp_ring_release(r, nxt)
                progress = True
        self._next_poll = (start + 1) % n
        return out

    def wait_results(self, double timeout_s, double spin_s=0.0):
        """Spins up to spin_s, then parks until a result, a kick or timeout_s.

        Releases the GIL throughout; returns True if there is work."""
        if self._b == NULL:
            return False
        cdef int has
        cdef int64_t t = _ns(timeout_s), sp = _ns(spin_s)
        with nogil:
            has = fp_board_wait_results(self._b, t, sp)
        return bool(has)

    def kick(self):
        """Wakes every parent thread parked in wait_results."""
        if self._b != NULL:
            fp_event_kick(&self._b.done)

    def flag_attention(self):
        """Marks non-ring work for the driver (a death) and wakes it."""
        if self._b != NULL:
            fp_store32_release(&self._b.attention, 1)
            fp_event_kick(&self._b.done)

    def take_attention(self):
        if self._b == NULL:
            return False
        return fp_xchg32_acqrel(&self._b.attention, 0) != 0

    def want(self, int delta):
        """A parent thread announces (+1) or withdraws (-1) its wish to drive."""
        if self._b == NULL:
            return
        if delta > 0:
            fp_add32_seqcst(&self._b.want, 1)
        else:
            fp_sub32_seqcst(&self._b.want, 1)

    def wanted(self):
        return self._b != NULL and fp_load32_acquire(&self._b.want) != 0

    def reset_slot(self, int slot):
        """Empties both rings and the slot words.  Only while no worker runs there."""
        self._ok(slot)
        cdef fp_slot_t *w = fp_board_slot(self._b, slot)
        fp_ring_reset(fp_board_ring(self._b, slot, TASKS))
        fp_ring_reset(fp_board_ring(self._b, slot, RESULTS))
        fp_store64_release(&w.current, 0)
        fp_store64_release(&w.cancel_id, 0)
        fp_store32_release(&w.pid, 0)
        fp_store32_release(&w.state, FP_SLOT_EMPTY)
        fp_add32_seqcst(&w.generation, 1)

    def slot_info(self, int slot):
        """(state, pid, current task, heartbeat, served) as seen right now."""
        self._ok(slot)
        cdef fp_slot_t *w = fp_board_slot(self._b, slot)
        return (fp_load32_acquire(&w.state), fp_load32_acquire(&w.pid),
                fp_load64_acquire(&w.current), fp_load64_acquire(&w.heartbeat),
                fp_load64_acquire(&w.served))

    def current(self, int slot):
        self._ok(slot)
        return fp_load64_acquire(&fp_board_slot(self._b, slot).current)

    def request_cancel(self, int slot, uint64_t task_id):
        self._ok(slot)
        fp_store64_release(&fp_board_slot(self._b, slot).cancel_id, task_id)


    # ---- worker side -------------------------------------------------------------

    def pop_task(self, int slot, double timeout_s, double spin_s=0.0):
        """Next task record as (kind, task_id, payload) or None after timeout_s.

        slot.current is set before the record is consumed, so at every instant
        the parent can tell which task a dead worker held."""
        self._ok(slot)
        cdef fp_ring_t *r = fp_board_ring(self._b, slot, TASKS)
        cdef fp_slot_t *w = fp_board_slot(self._b, slot)
        cdef fp_rec_t *rec
        cdef uint64_t nxt
        cdef int rc = fp_ring_peek(r, &rec, &nxt)
        cdef int64_t t = _ns(timeout_s), sp = _ns(spin_s)
        if rc == FP_AGAIN:
            with nogil:
                fp_ring_wait_data(r, NULL, t, sp)
            rc = fp_ring_peek(r, &rec, &nxt)
            if rc == FP_AGAIN:
                return None
        _check(rc, "pop task")
        payload = PyBytes_FromStringAndSize(<char *>rec + sizeof(fp_rec_t), rec.len)
        kind, task_id = rec.kind, rec.task_id
        if kind < 16:  # task kinds; control records are not tasks
            fp_store64_release(&w.current, rec.task_id)
        fp_ring_release(r, nxt)
        return (kind, task_id, payload)

    def push_result(self, int slot, uint32_t kind, uint64_t task_id, uint64_t aux, bytes payload,
                    double timeout_s=3600.0):
        """Publishes a result, waiting (GIL released) while the ring is full.

        Returns False if no room appeared within timeout_s."""
        self._ok(slot)
        cdef fp_ring_t *r = fp_board_ring(self._b, slot, RESULTS)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
        cdef const char *src = PyBytes_AS_STRING(payload)
        cdef int64_t deadline = fp_now_ns() + _ns(timeout_s)
        cdef uint64_t seen
        cdef int rc
        while True:
            seen = fp_load64_acquire(&r.head)
            rc = fp_ring_push(r, kind, task_id, aux, src, n)
            if rc != FP_AGAIN:
                break
            if fp_now_ns() >= deadline:
                return False
            with nogil:
                fp_ring_wait_space(r, seen, 50000000)
        if rc == FP_TOOBIG:
            raise errors.SerializationError(
                f"the result of task {task_id}", f"its pickle is {n} bytes, over the ring limit "
                f"of {self.max_record} bytes; return large arrays through a shared array")
        _check(rc, "push result")
        fp_board_notify_parent(self._b)
        return True

    def set_state(self, int slot, uint32_t state, uint32_t pid=0):
        self._ok(slot)
        cdef fp_slot_t *w = fp_board_slot(self._b, slot)
        if pid:
            fp_store32_release(&w.pid, pid)
        fp_store32_release(&w.state, state)

    def beat(self, int slot):
        if self._b != NULL:
            fp_add64_relaxed(&fp_board_slot(self._b, slot).heartbeat, 1)

    def finish_task(self, int slot):
        """The worker is idle again: current = 0, served += 1."""
        self._ok(slot)
        cdef fp_slot_t *w = fp_board_slot(self._b, slot)
        fp_add64_relaxed(&w.served, 1)
        fp_store64_release(&w.current, 0)

    def cancel_requested(self, int slot):
        """True if the parent asked to cancel the task this slot is running."""
        if self._b == NULL:
            return False
        cdef fp_slot_t *w = fp_board_slot(self._b, slot)
        cdef uint64_t c = fp_load64_acquire(&w.cancel_id)
        return c != 0 and c == fp_load64_acquire(&w.current)


def now_ns():
    return fp_now_ns()
