# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The shared-memory board: rings, slot words and waits, over one memfd.

    parent (_dispatch)                              worker (_serve)
    ------------------                              ---------------
    push_task(slot, kind, id, aux, a, b) --task ring--> next_task(slot): wait, peek
                                                     start_task(slot, id): current := id,
                                                       then the skip words (Dekker)
                                                     release_task; run; finish(slot)
    peek_result / release_result <---result ring--- put_result(slot, kind, id, aux, bytes)
    wait_results(): spin, then futex on board.done <- notify after each publish

Every ring has one producer and one consumer, and every word a dead process
could have been writing is either its own (its slot) or published last with a
release store, so a SIGKILL on any instruction leaves nothing held.  Waits
release the GIL, are bounded, and return on EINTR so Ctrl-C is seen.

The parent never trusts the segment: its views (csrc/fp_board.h) hold the
geometry it created the board with, and every record header a worker can
write is read once and checked against them (FP_CORRUPT, never a wild read).
A worker attaches by reading the header once and checking that copy.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

from fastpool import errors

from fastpool._native._shm cimport (
    FP_SHM_FD_FLOOR, fp_shm_attach, fp_shm_create, fp_shm_dup, fp_shm_map, fp_shm_privatise,
)
from fastpool._native._sys cimport (
    FP_AGAIN, FP_CORRUPT, FP_ERRNO, FP_INTR, FP_OK, FP_TIMEOUT, FP_TOOBIG, PROT_READ, PROT_WRITE,
    close, errno, munmap,
)

SLOT_EMPTY = FP_SLOT_EMPTY
SLOT_STARTING = FP_SLOT_STARTING
SLOT_READY = FP_SLOT_READY
SLOT_EXITING = FP_SLOT_EXITING
MAX_SLOTS = FP_BOARD_MAX_SLOTS
MAX_RING_BYTES = FP_RING_MAX_CAPACITY
MIN_RING_BYTES = 1 << 16

# The record kinds (csrc/fp_proto.h), for the Python side of the protocol.
K_CALL, K_CALLKW, K_CHUNK, K_STARCHUNK = FP_K_CALL, FP_K_CALLKW, FP_K_CHUNK, FP_K_STARCHUNK
K_STOP, K_INIT = FP_K_STOP, FP_K_INIT
R_OK, R_ERR, R_BAD_RESULT, R_SKIPPED = FP_R_OK, FP_R_ERR, FP_R_BAD_RESULT, FP_R_SKIPPED
R_READY, R_INIT_FAILED = FP_R_READY, FP_R_INIT_FAILED


cdef int check(int rc, str what) except -1:
    """The one mapping from an fp_status code to an exception, one message each."""
    if rc == FP_OK:
        return 0
    if rc == FP_ERRNO:
        import os
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    if rc == FP_CORRUPT:
        raise errors.SegmentCorrupt(f"{what}: the shared segment breaks its format (a stray write, "
                                    "or a board of another fastpool version)")
    if rc == FP_TOOBIG:
        raise errors.SerializationError(what, "it is larger than a ring record can be")
    if rc == FP_TIMEOUT:
        raise TimeoutError(f"{what}: timed out")
    if rc == FP_INTR:
        raise InterruptedError(f"{what}: interrupted by a signal")
    if rc == FP_AGAIN:
        raise BlockingIOError(f"{what}: no room or nothing to read right now")
    raise SystemError(f"{what}: unknown status {rc}")


def ring_limit_error(str what, Py_ssize_t nbytes, uint64_t limit, str advice=""):
    """The error for a pickled call or result over a ring's record limit."""
    return errors.SerializationError(
        what,
        f"its pickle is {nbytes} bytes, over the ring limit of {limit} bytes (ring_bytes / 2); "
        + (advice or "pass large arrays through shared memory (pool.share, pool.empty) or raise "
           "Pool(ring_bytes=...)"))


def check_ring_bytes(ring_bytes):
    """ValueError unless ring_bytes is a size the ring format holds."""
    if not isinstance(ring_bytes, int) or isinstance(ring_bytes, bool):
        raise TypeError(f"ring_bytes must be an int, not {type(ring_bytes).__name__}")
    if ring_bytes < MIN_RING_BYTES or ring_bytes % 4096 or ring_bytes > MAX_RING_BYTES:
        raise ValueError(f"ring_bytes must be a multiple of 4096 from 64 KiB to 8 GiB, "
                         f"not {ring_bytes}; "
                         "it is per ring, sparse, and one record may be up to half of it")


cdef inline int64_t _ns(double seconds) noexcept:
    if seconds <= 0:
        return 0
    if seconds > 3600.0:
        seconds = 3600.0
    return <int64_t>(seconds * 1e9)


cdef class Board:
    """A mapping of one pool's board.  The parent creates it; workers attach by fd.

    Thread safety: the parent serialises producers of a task ring (the
    dispatcher's lock) and consumers of the result rings (the drive lock);
    everything else is atomic.  Closing while another thread uses the board is
    the caller's bug (the pool closes it only after its threads stopped).
    """

    def __cinit__(self):
        self._v = NULL
        self._rings = NULL
        self._base = NULL
        self._fd = -1

    @staticmethod
    def create(int nslots, uint64_t ring_capacity, str name="fastpool"):
        """Makes a fresh board in a new sealed memfd (nothing appears in /dev/shm; no
        worker can shrink it under the parent), at an fd number over 1000."""
        if nslots < 1 or nslots > <int>FP_BOARD_MAX_SLOTS:  # an unsigned 1023: fits an int
            raise ValueError(f"a board holds 1 to {FP_BOARD_MAX_SLOTS} worker slots, not {nslots}")
        check_ring_bytes(ring_capacity)
        cdef Board self = Board.__new__(Board)
        cdef uint64_t size = fp_board_size(nslots, ring_capacity)
        cdef int fd = -1
        cdef void *p = NULL
        check(fp_shm_create(name.encode(), size, &fd, &p),
              f"creating the shared board ({size} bytes)")
        self._base, self._size, self._fd = p, size, fd
        check(fp_board_init(<fp_board_t *>self._base, nslots, ring_capacity), "board init")
        self._views(nslots, ring_capacity, True)
        return self

    @staticmethod
    def attach(int fd):
        """Maps an existing board from an inherited fd (the fd stays the caller's).

        The header is read once; that copy is checked (against the file's own size)
        and used from then on.  The mapping's fd is a duplicate over 1000, a number
        no object the worker inherited can own."""
        cdef Board self = Board.__new__(Board)
        cdef unsigned char head[4096]
        cdef uint32_t nslots = 0
        cdef uint64_t cap = 0, file_size = 0
        cdef int own = -1, rc
        cdef void *p = NULL
        rc = fp_shm_attach(fd, head, sizeof(head), &file_size)
        if rc == FP_CORRUPT:
            raise errors.SegmentCorrupt("the shared board is too short to be one")
        check(rc, "reading the shared board's header")
        if fp_board_check(<fp_board_t *>head, file_size, &nslots, &cap) != FP_OK:
            raise errors.SegmentCorrupt("the shared board's magic or layout version does not match "
                                        "this fastpool build")
        check(fp_shm_dup(fd, FP_SHM_FD_FLOOR, &own), "duplicating the board's fd")
        rc = fp_shm_map(own, fp_board_size(nslots, cap), PROT_READ | PROT_WRITE, &p)
        if rc != FP_OK:
            close(own)
            check(rc, "mapping the shared board")
        self._base, self._size, self._fd = p, fp_board_size(nslots, cap), own
        self._views(nslots, cap, False)
        return self

    cdef _views(self, uint32_t nslots, uint64_t cap, bint parent):
        self._v = <fp_boardv_t *>calloc(1, sizeof(fp_boardv_t))
        self._rings = <fp_ringv_t *>calloc(2 * nslots, sizeof(fp_ringv_t))
        if self._v == NULL or self._rings == NULL:
            raise MemoryError()
        check(fp_boardv_init(self._v, <fp_board_t *>self._base, self._size, nslots, cap,
                             self._rings, self._rings + nslots, parent), "board views")
        self._parent = parent
        self.nslots = nslots
        self.ring_capacity = cap
        self.max_record = fp_ring_max_record_for(cap)

    def fileno(self):
        return self._fd

    def layout(self):
        """Where things are in this mapping (diagnostics and fault tests): the base
        address, and per slot the byte offsets of its slot block and its two rings."""
        if self._base == NULL:
            raise errors.PoolClosed("the pool's shared board is closed")
        base = <size_t>self._base
        return dict(
            base=base, size=self._size, nslots=self.nslots, ring_capacity=self.ring_capacity,
            slots=[<size_t>fp_boardv_slot(self._v, i) - base for i in range(self.nslots)],
            task_rings=[<size_t>fp_boardv_ring_header(fp_boardv_tasks(self._v, i)) - base
                        for i in range(self.nslots)],
            result_rings=[<size_t>fp_boardv_ring_header(fp_boardv_results(self._v, i)) - base
                          for i in range(self.nslots)])

    @property
    def closed(self):
        return self._base == NULL

    @property
    def size(self):
        return self._size

    def close(self):
        """Unmaps and closes the fd.  Idempotent."""
        self._release()

    def disown(self):
        """In a forked child: the mapping becomes private in place and the fd is closed,
        so nothing this process writes reaches the pool's workers or its parent (issue
        15, section 4).  The geometry stays; the rings are a stale copy.  Idempotent."""
        if self._base != NULL and self._fd >= 0:
            fp_shm_privatise(self._fd, self._base, self._size, PROT_READ | PROT_WRITE)
        if self._fd >= 0:
            close(self._fd)
            self._fd = -1

    cdef _release(self):
        if self._base != NULL:
            munmap(self._base, self._size)
            self._base = NULL
        if self._fd >= 0:
            close(self._fd)
            self._fd = -1
        free(self._rings)
        free(self._v)
        self._rings = NULL
        self._v = NULL

    def __dealloc__(self):
        self._release()

    cdef int _ok(self, int slot) except -1:
        if self._base == NULL:
            raise errors.PoolClosed("the pool's shared board is closed")
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"slot {slot} out of range")
        return 0

    # ---- parent side: C-level, for the dispatcher ----------------------------------

    cdef int push_task(self, int slot, uint32_t kind, uint64_t task_id, uint64_t aux,
                       const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen) noexcept:
        """FP_OK, FP_AGAIN (full), FP_TOOBIG or FP_CORRUPT (the worker wrote the head)."""
        return fp_ringv_push2(fp_boardv_tasks(self._v, slot), kind, task_id, aux,
                              a, alen, b, blen, 1)

    cdef int peek_result(self, int slot, fp_recv_t *out) noexcept:
        return fp_ringv_peek(fp_boardv_results(self._v, slot), out)

    cdef void release_result(self, int slot, uint64_t nxt) noexcept:
        fp_ringv_release(fp_boardv_results(self._v, slot), nxt)

    cdef bint results_pending(self, int slot) noexcept:
        return not fp_ringv_empty(fp_boardv_results(self._v, slot))

    cdef bint worker_on(self, int slot, uint32_t cpu) noexcept:
        return fp_boardv_worker_on(self._v, slot, cpu)

    cdef uint64_t current_of(self, int slot) noexcept:
        return fp_slot_current(fp_boardv_slot(self._v, slot))

    cdef int skip_task(self, int slot, uint64_t seq, uint64_t task_id) noexcept:
        return fp_slot_skip(fp_boardv_slot(self._v, slot), seq, task_id)

    # ---- parent side: Python-level ---------------------------------------------------

    def push_control(self, int slot, uint32_t kind, bytes payload=b"", uint64_t tag=0):
        """Publishes a control record (K_INIT tagged with its spawn request, K_STOP)
        on slot's task ring.  False if the ring is full or broken (the caller kills
        the worker instead)."""
        self._ok(slot)
        cdef int rc = self.push_task(slot, kind, tag, 0, PyBytes_AS_STRING(payload),
                                     PyBytes_GET_SIZE(payload), NULL, 0)
        if rc == FP_TOOBIG:
            raise ring_limit_error("a control record", PyBytes_GET_SIZE(payload), self.max_record)
        return rc == FP_OK

    def wait_results(self, double timeout_s, double spin_s=0.0):
        """Spins up to spin_s, then parks until a result, a kick or timeout_s.

        Releases the GIL throughout; returns True if there is work."""
        if self._base == NULL:
            return False
        cdef int has
        cdef int64_t t = _ns(timeout_s), sp = _ns(spin_s)
        with nogil:
            has = fp_boardv_wait_results(self._v, t, sp)
        return bool(has)

    def kick(self):
        """Wakes every parent thread parked in wait_results."""
        if self._base != NULL:
            fp_board_kick(fp_boardv_board(self._v))

    def flag_attention(self):
        """Marks non-ring work for the driver (a death) and wakes it."""
        if self._base != NULL:
            fp_board_flag_attention(fp_boardv_board(self._v))

    def take_attention(self):
        return self._base != NULL and fp_board_take_attention(fp_boardv_board(self._v)) != 0

    def want(self, int delta):
        """A parent thread announces (+1) or withdraws (-1) its wish to drive."""
        if self._base != NULL:
            fp_boardv_want(self._v, delta)

    def wanted(self):
        return self._base != NULL and fp_boardv_wanted(self._v) != 0

    def reset_slot(self, int slot):
        """Empties both rings and the slot words, and rewrites the board header from
        the parent's geometry (for the worker about to attach).  Only while no
        worker runs in this slot."""
        self._ok(slot)
        if self._parent:
            fp_boardv_restore_header(self._v)
        fp_ringv_reset(fp_boardv_tasks(self._v, slot))
        fp_ringv_reset(fp_boardv_results(self._v, slot))
        fp_slot_reset(fp_boardv_slot(self._v, slot))

    def slot_info(self, int slot):
        """(state, pid, current task, heartbeat, served) as seen right now: worker-written."""
        self._ok(slot)
        cdef uint32_t state, pid
        cdef uint64_t cur, hb, served
        fp_slot_info(fp_boardv_slot(self._v, slot), &state, &pid, &cur, &hb, &served)
        return (state, pid, cur, hb, served)

    def current(self, int slot):
        self._ok(slot)
        return self.current_of(slot)

    def request_cancel(self, int slot, uint64_t task_id):
        self._ok(slot)
        fp_slot_request_cancel(fp_boardv_slot(self._v, slot), task_id)

    # ---- worker side ---------------------------------------------------------------

    cdef int next_task(self, int slot, fp_recv_t *out, int64_t timeout_ns,
                       int64_t spin_ns) noexcept nogil:
        """Waits (up to timeout_ns, spinning spin_ns first) and peeks the next task record."""
        cdef fp_ringv_t *r = fp_boardv_tasks(self._v, slot)
        cdef int rc = fp_ringv_peek(r, out)
        if rc == FP_AGAIN and timeout_ns > 0:
            fp_boardv_wait_task(self._v, slot, timeout_ns, spin_ns)
            rc = fp_ringv_peek(r, out)
        return rc

    cdef bint start_task(self, int slot, uint64_t task_id) noexcept:
        """current := task_id before the record is consumed, so at every instant
        the parent can tell which task a dead worker held.  True: the parent
        asked to drop this task before it started; do not run it."""
        return fp_slot_start(fp_boardv_slot(self._v, slot), task_id) != 0

    cdef void release_task(self, int slot, uint64_t nxt) noexcept:
        fp_ringv_release(fp_boardv_tasks(self._v, slot), nxt)

    cdef void finish(self, int slot, bint ran) noexcept:
        fp_slot_finish(fp_boardv_slot(self._v, slot), ran)

    cdef int put_result(self, int slot, uint32_t kind, uint64_t task_id, uint64_t aux,
                        const char *p, Py_ssize_t n, int64_t timeout_ns) except -1:
        """Publishes a result, waiting (GIL released) while the ring is full.

        1 when published, 0 if no room appeared within timeout_ns; raises for a
        record over the ring limit."""
        cdef fp_ringv_t *r = fp_boardv_results(self._v, slot)
        cdef int64_t deadline = fp_now_ns() + timeout_ns
        cdef uint64_t seen
        cdef int rc
        while True:
            seen = fp_ringv_head(r)
            rc = fp_ringv_push2(r, kind, task_id, aux, p, n, NULL, 0, 0)
            if rc != FP_AGAIN:
                break
            if fp_now_ns() >= deadline:
                return 0
            with nogil:
                fp_ringv_wait_space(r, seen, 50000000)
        if rc == FP_TOOBIG:
            raise ring_limit_error(  # the board knows wire ids only: the caller names the task
                "a result", n, self.max_record,
                "return large arrays through a shared array (pool.empty) instead")
        check(rc, "push result")
        fp_board_notify_parent(fp_boardv_board(self._v))
        return 1

    def pop_task(self, int slot, double timeout_s, double spin_s=0.0):
        """The next task record as (kind, task_id, payload), or None after timeout_s.

        The worker's control path (its K_INIT record); the serving loop in
        _serve uses next_task and start_task directly."""
        self._ok(slot)
        cdef fp_recv_t rec
        cdef int rc
        cdef int64_t t = _ns(timeout_s), sp = _ns(spin_s)
        with nogil:
            rc = self.next_task(slot, &rec, t, sp)
        if rc == FP_AGAIN:
            return None
        check(rc, "pop task")
        payload = PyBytes_FromStringAndSize(<const char *>rec.payload, rec.len)
        if rec.kind < FP_K_TASK_LIMIT:
            self.start_task(slot, rec.task_id)
        self.release_task(slot, rec.next)
        return (rec.kind, rec.task_id, payload)

    def pop_init(self, int slot, uint64_t req, double timeout_s):
        """A new worker's K_INIT payload, if the next record is the one tagged with its
        own spawn request; None (the record left in place) otherwise, or after
        timeout_s."""
        self._ok(slot)
        cdef fp_recv_t rec
        cdef int rc
        cdef int64_t t = _ns(timeout_s)
        with nogil:
            rc = self.next_task(slot, &rec, t, 0)
        if rc != FP_OK or rec.kind != FP_K_INIT or rec.task_id != req:
            return None
        payload = PyBytes_FromStringAndSize(<const char *>rec.payload, rec.len)
        self.release_task(slot, rec.next)
        return payload

    def set_state(self, int slot, uint32_t state, uint32_t pid=0):
        self._ok(slot)
        fp_slot_set_state(fp_boardv_slot(self._v, slot), state, pid)

    def beat(self, int slot):
        if self._base != NULL:
            fp_slot_beat(fp_boardv_slot(self._v, slot))

    def park_beat(self, int slot, uint64_t served_seen, double timeout_s):
        """The heartbeat thread of an idle worker: sleeps (GIL released) until the
        worker takes a task or timeout_s passes, unless a task is current or
        served moved off served_seen.  True if it slept."""
        if self._base == NULL:
            return False
        cdef fp_slot_t *s = fp_boardv_slot(self._v, slot)
        cdef int64_t t = _ns(timeout_s)
        cdef int slept
        with nogil:
            slept = fp_slot_park_beat(s, served_seen, t)
        return bool(slept)

    def beat_parked(self, int slot):
        """True while slot's heartbeat thread sleeps (its worker idles): worker-written."""
        self._ok(slot)
        return fp_slot_beat_parked(fp_boardv_slot(self._v, slot)) != 0

    def cancel_requested(self, int slot):
        """True if the parent asked to cancel the task this slot is running."""
        return self._base != NULL and fp_slot_cancel_requested(fp_boardv_slot(self._v, slot)) != 0

    def push_result(self, int slot, uint32_t kind, uint64_t task_id, uint64_t aux, bytes payload,
                    double timeout_s=3600.0):
        """Python-level put_result: True when published."""
        self._ok(slot)
        return self.put_result(slot, kind, task_id, aux, PyBytes_AS_STRING(payload),
                               PyBytes_GET_SIZE(payload), _ns(timeout_s)) == 1


def now_ns():
    return fp_now_ns()
