# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The arena: one pool's reference-counted shared blocks, over one sparse memfd.

    parent (pool.py, _arrays)                     worker (_worker.py, _arrays)
    ------------------------                      ---------------------------
    Arena.create(nworkers, budget)  --fd at spawn--> Arena.attach(fd, 1 + slot)
    alloc(n) -> Block in region 0                    alloc(n) -> Block in region 1 + slot
    Block in a call's pins ---(off, gen) in ring---> ref(off, gen) -> Block (own counter)
    ref(off, gen) + unref_for(w) <--(off, gen)------ handoff(off): +1 the parent takes over
    reclaim(slot) after the worker died; check_region / reset_region when a chain is damaged

A Block holds one reference of its process and exports the block's bytes as a
buffer; ndarrays are views over it (made in _ndarray.pyx, described and rebuilt by
fastpool/_runtime/_arrays.py), so the block lives while any view does.
In a worker, NumPy's allocator hook (_alloc.pyx) takes blocks too: there the
ndarray's own data holds the reference, and NumPy's free drops it.
A Block also keeps its Arena object, hence the mapping, alive: an array used
after its pool shut down is still plain memory, never a dangling pointer.

Distrust.  Every worker maps the whole arena read-write and runs any
code, so every header may be garbage.  Each Arena keeps a private
fp_arena_view_t (its own base and the geometry checked once at create or
attach); the C functions take that view and read each shared length once,
check it, then use it, and every walk goes through the one bounded walker in
fp_arena.h.  Damage comes back as RegionCorrupt (a SegmentCorrupt) naming the
region, never as a hang or a crash, and a Block keeps the length it was given
when it was made: rewriting a header later changes nothing NumPy sees.

What a worker can still overwrite: the data of every block, and every block
header, in every region; only its own process suffers for headers it breaks
in its own region once the parent resets that region, but data it scribbles
over is simply changed.  A readonly block (share(arr, readonly=True)) is
mapped PROT_READ in the process that receives it, so a stray write there
faults in that process instead.  Keeping a worker from writing other regions
needs the reference counts out of the block headers (a count table per
process, in pages of its own): headers share their first page with data,
and every process must write its counter in blocks of every region.

Fork.  A forked child of any process that maps an arena (the parent, a worker
running a task) remaps it privately in place (_disown_after_fork): the arrays it
inherited become copy-on-write memory, and nothing it writes reaches the pool.
An arena already closed (its pool shut down, its arrays still held) has no fd
left to remap from, so arrays kept past their pool stay shared in a child.
"""

import operator
import os
import weakref

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from cpython.buffer cimport PyBUF_WRITABLE, PyBUF_FORMAT

from fastpool import errors

from fastpool._native._sys cimport (
    FP_ERRNO, FP_OK, PROT_READ, PROT_WRITE, close, errno, munmap, write,
)

from fastpool._native._shm cimport (
    FP_SHM_FD_FLOOR, fp_shm_attach, fp_shm_create, fp_shm_dup, fp_shm_map, fp_shm_privatise,
)

PARENT = 0
ARENA_MIN_BYTES = 1 << 20
ARENA_MAX_DEFAULT_BYTES = 64 << 30
MEMINFO_CHECK_BYTES = 16 << 20  # fresh blocks this large check MemAvailable first
# What a trim keeps of each process's freed blocks, mapped and warm for the next
# arrays (the small ones first in the chain: pickles, small arrays, a few slices);
# the pages of the rest go back to the kernel (docs/arrays.md, "Memory that comes back").
TRIM_RESERVE_BYTES = 16 << 20

_registry = {}  # token -> weakref to the Arena of that token in this process


def lookup(uint64_t token):
    """The open Arena named token in this process, or None."""
    ref = _registry.get(token)
    return ref() if ref is not None else None


def mem_available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_budget():
    """Half the memory available now, at most 64 GiB (a sparse memfd: only blocks in use cost)."""
    avail = mem_available_bytes() or (8 << 30)
    return max(64 << 20, min(ARENA_MAX_DEFAULT_BYTES, avail // 2))


cdef str _mib(uint64_t n):
    return f"{n / 1048576.0:.1f} MiB"


cdef object _status_error(Arena a, int rc, const fp_arena_damage_t *d, uint64_t nbytes,
                          uint64_t off, bint held):
    # The one place an fp_arena_* status becomes an exception (None for FP_OK).
    # held: this process holds a Block on off, so a changed generation is damage
    # rather than a descriptor that outlived its block.
    if rc == FP_OK:
        return None
    if rc == FP_NOSPACE:
        return a._nospace(nbytes, "")
    if rc == FP_STALE and held:
        return errors.SegmentCorrupt(f"shared block at {off} changed generation while referenced")
    if rc == FP_STALE:
        return errors.SharedMemoryError(
            f"shared block at {off} was reused before this descriptor was read (fastpool bug)")
    if rc == FP_ERRNO:
        return OSError(errno, os.strerror(errno))
    text = fp_arena_damage_text(d.why).decode()
    if d.region >= a._v.nprocs:
        return errors.SegmentCorrupt(
            f"no shared block at arena offset {d.at}: {text} (read {d.value})")
    return errors.RegionCorrupt(d.region, f"{text} (read {d.value})", d.at)


cdef int check(Arena a, int rc, const fp_arena_damage_t *d, uint64_t nbytes=0, uint64_t off=0,
               bint held=False) except -1:
    """Raises the exception for status rc of an fp_arena_* function (see _status_error)."""
    if rc == FP_OK:
        return 0
    raise _status_error(a, rc, d, nbytes, off, held)


def geometry(nworkers, budget):
    """(nprocs, region_bytes, total_bytes) of an arena for nworkers and a budget.

    Raises TypeError for a non-integer and ValueError for sizes the layout cannot
    hold: fewer than 1 MiB, or regions (one per process, each as large as the
    budget, of address space only) that would span more than FP_ARENA_MAX_BYTES."""
    try:
        nworkers, budget = operator.index(nworkers), operator.index(budget)
    except TypeError:
        raise TypeError(f"arena_bytes and the worker count must be integers, not {budget!r}, "
                        f"{nworkers!r}") from None
    if not 1 <= nworkers < FP_ARENA_MAX_PROCS:
        raise ValueError(f"an arena serves 1 to {FP_ARENA_MAX_PROCS - 1} workers, not {nworkers}")
    if budget < ARENA_MIN_BYTES:
        raise ValueError(f"arena_bytes must be at least 1 MiB, not {budget}")
    nprocs = nworkers + 1
    cap = (FP_ARENA_MAX_BYTES - FP_ARENA_PAGE * (1 + (8 * nprocs + 128) // FP_ARENA_PAGE)) // nprocs
    cap -= cap % FP_ARENA_PAGE
    if budget > cap:
        raise ValueError(
            f"arena_bytes={budget} is too large for {nworkers} workers: each of the {nprocs} "
            f"processes gets a region of address space as large as the budget, and together "
            f"they may span at most {FP_ARENA_MAX_BYTES >> 40} TiB; "
            f"pass at most {cap} ({cap >> 30} GiB)")
    region = (budget + FP_ARENA_PAGE - 1) // FP_ARENA_PAGE * FP_ARENA_PAGE
    return nprocs, region, fp_arena_size(nprocs, region)


cdef int recommit(Arena a, uint64_t off, uint64_t size) noexcept:
    """fp_pages_recommit on a's own region: 0, or -1 with errno (fp_pages.h)."""
    return fp_pages_recommit(a._fd, &a._v, a._own_base(), a._punched, &a._npunched, off, size)


cdef class Arena:
    """One mapping of a pool's arena.  The parent creates it; each worker attaches by fd.

    Thread safety: alloc, ref and the Block methods run with the GIL held and
    never release it, so the one-allocator-per-region rule holds per process;
    so does trim (a punch of a large block holds it for a few milliseconds).
    """

    def __cinit__(self):
        self._v.base = NULL
        self._ro = NULL
        self._fd = -1
        self._own_top = FP_ARENA_TOP_UNKNOWN
        self._held = NULL
        self._punched = NULL
        self._wake_fd = -1

    @staticmethod
    def create(nworkers, budget, str name="fastpool-arena"):
        """A fresh arena in a new sealed memfd (nothing in /dev/shm).  Each region
        may hold the whole budget: the budget, not the region, limits what is used.

        Raises ValueError for sizes the layout cannot hold (see geometry) and
        SharedMemoryError when the kernel refuses the memfd or its mapping."""
        cdef Arena self = Arena.__new__(Arena)
        nprocs, region, size = geometry(nworkers, budget)
        cdef int fd = -1
        cdef void *p = NULL
        if fp_shm_create(name.encode(), size, &fd, &p) != FP_OK:
            raise errors.SharedMemoryError(
                f"cannot create the shared arena ({size} bytes of address space): "
                f"{os.strerror(errno)}; pass a smaller Pool(arena_bytes=...)")
        token = (int.from_bytes(os.urandom(8), "little") >> 1) | 1  # random: 1 ms to import
        if fp_arena_init(p, size, nprocs, region, budget, token, &self._v) != FP_OK:
            munmap(p, size)  # unreachable: geometry() checked the same bounds
            close(fd)
            raise errors.SegmentCorrupt("arena init: bad sizes")
        self._fd = fd
        self.proc = PARENT
        self._register()
        return self

    @staticmethod
    def attach(int fd, uint32_t proc):
        """Maps an existing arena from an inherited fd (the fd stays the caller's).

        The header is read once into private memory and checked against the
        file's real size; the geometry used from then on is that copy."""
        cdef Arena self = Arena.__new__(Arena)
        cdef fp_arena_t head
        cdef uint64_t file_size = 0
        cdef int own = -1
        cdef void *p = NULL
        cdef int rc = fp_shm_attach(fd, &head, sizeof(fp_arena_t), &file_size)
        if rc == FP_ERRNO:
            raise OSError(errno, f"cannot read the shared arena: {os.strerror(errno)}")
        if rc != FP_OK:
            raise errors.SegmentCorrupt("the shared arena is too short to be one")
        if fp_arena_attach(&head, NULL, file_size, &self._v) != FP_OK:
            raise errors.SegmentCorrupt("the shared arena's magic or layout version does not match "
                                        "this fastpool build")
        if proc >= self._v.nprocs:
            raise errors.SegmentCorrupt(
                f"process index {proc} is outside the arena's {self._v.nprocs}")
        if fp_shm_dup(fd, FP_SHM_FD_FLOOR, &own) != FP_OK:
            raise OSError(errno, f"cannot duplicate the shared arena's fd: {os.strerror(errno)}")
        if fp_shm_map(own, self._v.total_size, PROT_READ | PROT_WRITE, &p) != FP_OK:
            e = errno
            close(own)
            raise errors.SharedMemoryError(
                f"cannot map the shared arena ({self._v.total_size} bytes): {os.strerror(e)}")
        self._v.base = <unsigned char *>p
        self._fd = own
        self.proc = proc
        self._register()
        return self

    def _register(self):
        self.token = self._v.token
        _registry[self.token] = weakref.ref(self)

    def fileno(self):
        return self._fd

    @property
    def budget(self):
        return self._v.budget if self._v.base != NULL else 0

    @property
    def nprocs(self):
        """Processes the arena serves: the parent and one per worker slot."""
        return self._v.nprocs

    @property
    def region_bytes(self):
        return self._v.region_size

    @property
    def regions_offset(self):
        """Where region 0 starts; region r starts r * region_bytes after it."""
        return self._v.regions_offset

    @property
    def header_bytes(self):
        """A block header's bytes: a block's data starts this far into it."""
        return self._v.hdr

    @property
    def base_address(self):
        """Where this process maps the arena (0 once unmapped): for tests that scribble on it."""
        return <size_t>self._v.base

    def close(self):
        """Closes the fd and stops new references.  Free blocks' pages are given
        back now (a damaged region's only up to its damage: close never raises
        for damage); the mapping goes when the last Block of this process does,
        so arrays still held stay valid memory.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._unwake()
        if _registry.get(self.token) is not None and _registry[self.token]() is self:
            del _registry[self.token]
        if self._fd >= 0:
            if self._v.base != NULL:
                self._punch_free()
            close(self._fd)
            self._fd = -1
        self._maybe_unmap()

    cdef _disown(self):
        # In a forked child: the mapping becomes private in place, so arrays the
        # child inherited (pool.empty's, results, a worker's NumPy-hook arrays) are
        # ordinary copy-on-write memory there, and nothing the child writes (data,
        # counts in block headers) reaches the pool's other processes.  No pages are
        # punched and no counts dropped: the segment is the parent's.  If the kernel
        # refuses the private mapping the shared one stays (and the arena is closed).
        if self._fd >= 0:
            if self._v.base != NULL:
                fp_shm_privatise(self._fd, self._v.base, self._v.total_size, PROT_READ | PROT_WRITE)
            if self._ro != NULL:
                fp_shm_privatise(self._fd, self._ro, self._v.total_size, PROT_READ)
            close(self._fd)
            self._fd = -1
        self._unwake()  # the parent's supervisor's pipe: the child's frees are no news to it
        self.closed = True
        self._maybe_unmap()

    def wake_on_free(self, int fd, uint64_t min_bytes=0):
        """From now on, once this process has dropped ``min_bytes`` of its region's blocks
        since the last ``arm_wake``, one byte is written to ``fd`` (once per arming): the
        supervisor, asleep while the pool idles, wakes to trim what an array freed then
        left (docs/arrays.md, "Memory that comes back").  The arena owns ``fd`` (a dup)
        and closes it here when replaced, at close and in a forked child.  ``fd`` -1:
        no more wakes."""
        self._unwake()
        self._wake_fd, self._wake_min = fd, max(min_bytes, <uint64_t>1)  # _wake_at 0: not armed

    def arm_wake(self):
        """The next ``min_bytes`` this process drops wake the fd of ``wake_on_free``."""
        self._wake_at = self.freed + self._wake_min

    cdef void _dropped_own(self, uint64_t nbytes) noexcept:
        # A Block or a hook block of the own region dropped here (with the GIL).  The
        # write is one syscall, made at most once per arming: a pool asleep costs its
        # parent's frees nothing else.
        cdef char one = 120  # b"x"
        self.freed += nbytes
        if self._wake_fd >= 0 and self._wake_at and self.freed >= self._wake_at:
            self._wake_at = 0
            write(self._wake_fd, &one, 1)  # a full pipe already says "wake"

    cdef _unwake(self):
        if self._wake_fd >= 0:
            close(self._wake_fd)
        self._wake_fd, self._wake_at = -1, 0

    cdef _punch_free(self):
        cdef uint32_t r
        for r in range(self._v.nprocs):
            self._punch_free_region(r)

    cdef _punch_free_region(self, uint32_t r):
        fp_pages_punch_free(&self._v, r, self._fd)

    cdef _maybe_unmap(self):
        if self.closed and self._blocks == 0:
            self._unmap()

    cdef _unmap(self):
        if self._v.base != NULL:
            munmap(self._v.base, self._v.total_size)
            self._v.base = NULL
        if self._ro != NULL:
            munmap(self._ro, self._v.total_size)
            self._ro = NULL

    def __dealloc__(self):
        self._unmap()
        self._unwake()
        free(self._held)
        free(self._seen_end)
        free(self._punched)
        if self._fd >= 0:
            close(self._fd)

    cdef char *_ro_base(self):
        # A second, PROT_READ mapping of the same memfd, made once: readonly blocks
        # are exposed through it, so a write that ignores NumPy's flag (a C
        # extension, a ctypes pointer) faults here instead of changing the bytes
        # other processes read.  If the kernel refuses it, the read-write mapping
        # serves (the buffer is still exported read-only).
        cdef void *p = NULL
        if self._ro == NULL and self._fd >= 0:
            if fp_shm_map(self._fd, self._v.total_size, PROT_READ, &p) == FP_OK:
                self._ro = p
        return <char *>(self._ro if self._ro != NULL else self._v.base)

    cdef Block _block(self, fp_arena_blk_t *b, bint readonly):
        # b comes from fp_arena_alloc or fp_arena_ref: its size was read once and
        # checked to hold a header and to end inside its region's top.
        cdef Block blk = Block.__new__(Block)
        cdef char *base = self._ro_base() if readonly else <char *>self._v.base
        blk.arena = self
        blk.off = b.off
        blk.gen = b.gen
        blk.nbytes = b.size - self._v.hdr
        blk.data = base + b.off + self._v.hdr
        blk.readonly = readonly
        blk._shape[0] = <Py_ssize_t>blk.nbytes
        blk._strides[0] = 1
        blk._own = (b.off - self._v.regions_offset) // self._v.region_size == self.proc
        if blk._own:
            if self._held == NULL:  # sparse: only pages of it that index used blocks cost memory
                self._held = <uint32_t *>calloc(self._v.region_size // FP_ARENA_PAGE,
                                                sizeof(uint32_t))
            if self._held != NULL:
                self._held[(b.off - self._own_base()) // FP_ARENA_PAGE] += 1
        self._blocks += 1
        return blk

    cdef uint64_t _own_base(self):
        return self._v.regions_offset + <uint64_t>self.proc * self._v.region_size

    cdef bint _holds_any(self, uint64_t off, uint64_t size):
        # A reused block of the own region must not cover a block this process
        # still holds a Block on: free by its shared counts yet held by a private
        # one means someone zeroed the counts, or forged a size over it.
        cdef uint64_t i, first = (off - self._own_base()) // FP_ARENA_PAGE
        if self._held == NULL:
            return False
        for i in range(first, first + size // FP_ARENA_PAGE):
            if self._held[i]:
                return True
        return False

    cdef int _usable(self) except -1:
        if self.closed or self._v.base == NULL:
            raise errors.PoolClosed("this pool's shared memory is closed: the pool was shut down")
        return 0

    cpdef Block alloc(self, uint64_t nbytes):
        """A block of at least nbytes in this process's region, holding its reference.

        Raises SharedMemoryError, before touching anything, when the arena's
        budget or the machine's free memory cannot hold it, and RegionCorrupt
        when this process's region is damaged."""
        self._usable()
        cdef fp_arena_blk_t b
        cdef fp_arena_damage_t d
        cdef Block blk
        cdef uint64_t fresh_len = 0
        check(self, fp_arena_alloc(&self._v, self.proc, nbytes, &b, &fresh_len, &self._own_top, &d),
              &d, nbytes)
        self.allocs += 1
        if fresh_len:
            try:
                self._commit(b.off, fresh_len, nbytes)
            except BaseException:
                fp_arena_unbump(&self._v, self.proc, &b, &self._own_top)
                raise
        elif self._holds_any(b.off, b.size):
            # Handing it out would put two arrays on the same bytes.
            fp_arena_unref(&self._v, self.proc, b.off)
            raise errors.RegionCorrupt(
                self.proc,
                "a free block covers one this process still holds (its counts were "
                "zeroed, or a size was forged)",
                b.off - self._own_base())
        elif recommit(self, b.off, b.size) != 0:
            e = errno
            fp_arena_unref(&self._v, self.proc, b.off)
            raise self._nospace(nbytes, f"the kernel refused the pages: {os.strerror(e)}")
        blk = self._block(&b, False)
        blk.fresh = fresh_len != 0
        return blk

    cdef _commit(self, uint64_t off, uint64_t length, uint64_t nbytes):
        # Fresh pages are taken now, where failure is an exception: a page the
        # kernel cannot supply on first touch is a SIGBUS in whoever touches it
        # (fp_pages_commit also maps them, for the first copy's sake).
        cdef int rc
        if length >= MEMINFO_CHECK_BYTES:
            avail = mem_available_bytes()
            if avail is not None and length > avail:
                raise self._nospace(nbytes, f"the machine has {_mib(avail)} available")
        with nogil:
            rc = fp_pages_commit(self._fd, self._v.base, off, length)
        if rc != 0:
            raise self._nospace(nbytes, f"the kernel refused the pages: {os.strerror(errno)}")

    def _nospace(self, uint64_t nbytes, str why):
        u = self._usage(False)
        return errors.SharedMemoryError(
            f"cannot place {_mib(nbytes)} in the pool's shared memory: "
            f"{_mib(u['live_bytes'])} of its {_mib(u['budget_bytes'])} budget is in use by "
            f"live arrays, {_mib(u['free_bytes'])} is free in freed blocks"
            f"{'; ' + why if why else ''}. Drop shared arrays you no longer need, or create the "
            "pool with a larger Pool(arena_bytes=...) (default: half the available memory, "
            "at most 64 GiB); in a container, raise its memory limit")

    cpdef Block ref(self, uint64_t off, uint64_t gen, bint readonly):
        """This process's own reference on a block named by a descriptor.

        The Block's length is the block's size read once and checked here; it
        never changes afterwards.  Raises SharedMemoryError for a reused block
        and SegmentCorrupt (RegionCorrupt when a region is to blame) for an
        offset or a header that does not check out."""
        self._usable()
        cdef fp_arena_blk_t b
        cdef fp_arena_damage_t d
        check(self, fp_arena_ref(&self._v, self.proc, off, gen, &b, &d), &d, 0, off)
        self._saw(&b)
        return self._block(&b, readonly)

    cdef _saw(self, fp_arena_blk_t *b):
        # Every block that leaves a worker's region reaches others through this
        # process's ref: the furthest end seen bounds what reset_region must keep.
        cdef uint64_t rel = b.off - self._v.regions_offset
        cdef uint32_t r = <uint32_t>(rel // self._v.region_size)
        cdef uint64_t end = rel - <uint64_t>r * self._v.region_size + b.size
        if self._seen_end == NULL:
            self._seen_end = <uint64_t *>calloc(self._v.nprocs, sizeof(uint64_t))
            if self._seen_end == NULL:
                raise MemoryError()
        if r < self._v.nprocs and end > self._seen_end[r]:
            self._seen_end[r] = end

    def handoff(self, Block blk):
        """One more reference for this process, that the receiver drops (unref_for)."""
        self._usable()
        cdef fp_arena_blk_t b
        cdef fp_arena_damage_t d
        check(self, fp_arena_ref(&self._v, self.proc, blk.off, blk.gen, &b, &d), &d, 0, blk.off,
              True)

    def unref_for(self, uint32_t proc, uint64_t off):
        """Drops one reference of process proc; an offset that is no block header is ignored."""
        if self._v.base != NULL:
            fp_arena_unref(&self._v, proc, off)

    def count(self, uint32_t proc, uint64_t off):
        """References process proc holds on the block at off (tests, telemetry).

        Raises ValueError when off cannot be a block header or proc is out of range."""
        cdef uint32_t n = 0
        if self._v.base == NULL:
            return 0
        if fp_arena_count(&self._v, proc, off, &n) != FP_OK:
            raise ValueError(f"no block header of process {proc} at offset {off}")
        return n

    def is_free(self, uint64_t off):
        cdef int free_ = 0
        if self._v.base == NULL or fp_arena_is_free(&self._v, off, &free_) != FP_OK:
            raise ValueError(f"no block header at offset {off}")
        return bool(free_)

    def reclaim(self, int slot):
        """Drops every reference worker slot held (it died), then gives back the pages
        of its region's free blocks.  Returns how many blocks it held.

        Raises RegionCorrupt naming the first damaged region, after every
        intact region (and each damaged one up to its damage) was reclaimed."""
        cdef uint64_t held = 0
        cdef fp_arena_damage_t d
        if self._v.base == NULL or slot < 0 or slot + 1 >= <int>self._v.nprocs:
            return 0
        cdef int rc = fp_arena_reclaim(&self._v, slot + 1, &held, &d)
        # Its free blocks keep the pages it faulted in (NumPy's arrays, through
        # _alloc, up to half the budget) until the pool closes, unless given back
        # now: with the owner dead, no process can claim a block of its region.
        self._punch_free_region(slot + 1)
        check(self, rc, &d)
        return held

    def trim(self, uint64_t reserve=TRIM_RESERVE_BYTES):
        """Gives back to the kernel the pages of this process's freed blocks beyond
        ``reserve`` bytes of them, which stay mapped for the next arrays.

        Only the region's owner reuses its blocks, so only it trims them: each block
        is claimed first (fp_arena_claim_free: nothing can reference or reuse it
        meanwhile), its data pages punched out of the memfd (every process's
        mapping of them goes with them; its header page stays for the walks), then
        released, its pages flagged so that the allocator takes them again
        (recommit) when it reuses the block.  A block anyone references is never
        touched, so no live array ever reads the zeros of a punched page.  The GIL
        stays held.  Returns (bytes given back now, live
        blocks left in the region: what may still be freed and trimmed later).
        A closed arena, or a damaged region (past its damage), trims nothing."""
        cdef uint64_t given = 0, live = 0
        if self.closed or self._fd < 0 or self._v.base == NULL:
            return 0, 0
        if self._punched == NULL:
            self._punched = <uint8_t *>calloc(self._v.region_size // FP_ARENA_PAGE, 1)
            if self._punched == NULL:
                raise MemoryError()
        # With the GIL held: in the parent any thread allocates in region 0 (the NumPy
        # hook), and the walk must not see the chain change under it.
        fp_pages_trim(&self._v, self.proc, self._fd, self._own_base(), self._punched,
                      &self._npunched, reserve, &given, &live)
        return given, live

    def memory(self):
        """What the arena holds, in bytes (stats()["arena"]): ``budget_bytes``;
        ``high_water_bytes``, what the regions grew to (= ``live_bytes`` + ``free_bytes``:
        blocks tile each region up to its top); ``live_bytes``, in blocks someone
        references; ``free_bytes``, in freed blocks, warm or given back;
        ``held_bytes``, the memory the arena holds now, read from the kernel (the memfd's
        pages: the arena's header page, live blocks, the warm reserves, one header page
        per freed block); ``reserve_bytes``,
        the most that trims keep warm (TRIM_RESERVE_BYTES per process);
        ``returned_bytes``, what trims gave back, all processes, since the pool started."""
        u = self._usage(False)
        resident = 0
        if self._fd >= 0:
            try:
                resident = os.fstat(self._fd).st_blocks * 512
            except OSError:
                pass
        return dict(
            budget_bytes=u["budget_bytes"],
            high_water_bytes=u["live_bytes"] + u["free_bytes"],
            live_bytes=u["live_bytes"],
            free_bytes=u["free_bytes"],
            held_bytes=resident,
            reserve_bytes=TRIM_RESERVE_BYTES * self._v.nprocs,
            returned_bytes=fp_arena_returned(&self._v) if self._v.base != NULL else 0,
        )

    def check_region(self, uint32_t region):
        """Walks region (0: the parent, 1 + s: worker slot s); returns its block count.

        Raises RegionCorrupt saying where and what, ValueError for no such region."""
        cdef uint64_t n = 0
        cdef fp_arena_damage_t d
        if region >= self._v.nprocs:
            raise ValueError(f"the arena has regions 0 to {self._v.nprocs - 1}, not {region}")
        if self._v.base != NULL:
            check(self, fp_arena_check_region(&self._v, region, &n, &d), &d)
        return n

    def corrupt_regions(self):
        """{region: RegionCorrupt} for every damaged region (empty when all are whole)."""
        cdef uint64_t n = 0
        cdef fp_arena_damage_t d
        cdef uint32_t r
        cdef int rc
        found = {}
        if self._v.base == NULL:
            return found
        for r in range(self._v.nprocs):
            rc = fp_arena_check_region(&self._v, r, &n, &d)
            if rc != FP_OK:
                found[r] = _status_error(self, rc, &d, 0, 0, False)
        return found

    def reset_region(self, uint32_t region):
        """Makes a damaged region's chain whole again, for the next process in that slot.

        Call it in the parent after the region's worker died and reclaim(slot)
        ran (a live owner would race the repair), or on this process's own
        region.  Blocks before the damage stay as they are; from the damage to
        the region's old top (its end, if the top itself is garbage) one block
        is quarantined: pinned, never reused, because other processes may still
        map blocks there, whose bytes are left untouched.  Returns the bytes
        quarantined (0: the chain was whole).  Raises ValueError for a region
        out of range, or another process's region from a worker."""
        cdef uint64_t q = 0
        cdef fp_arena_damage_t d
        self._usable()
        if region >= self._v.nprocs:
            raise ValueError(f"the arena has regions 0 to {self._v.nprocs - 1}, not {region}")
        if self.proc != PARENT and region != self.proc:
            raise ValueError("only the parent resets another process's region")
        fp_arena_reset_region(&self._v, region,
                              self._seen_end[region] if self._seen_end != NULL else 0, &q, &d)
        if region == self.proc:
            self._own_top = FP_ARENA_TOP_UNKNOWN
        return q

    def _usage(self, bint strict):
        cdef uint64_t live = 0, idle = 0, nlive = 0
        cdef fp_arena_damage_t d
        cdef int rc
        if self._v.base == NULL:
            return dict(live_bytes=0, free_bytes=0, live_blocks=0, budget_bytes=0, unused_bytes=0)
        rc = fp_arena_usage(&self._v, &live, &idle, &nlive, &d)
        if strict:
            check(self, rc, &d)
        budget = self._v.budget
        return dict(live_bytes=live, free_bytes=idle, live_blocks=nlive, budget_bytes=budget,
                    unused_bytes=max(0, budget - live - idle))

    def held_bytes(self, uint32_t proc):
        """Bytes of region proc's blocks that process proc itself references (a
        worker's own arrays in shared memory); what the walk could not reach past
        damage is not counted."""
        cdef uint64_t n = 0
        cdef fp_arena_damage_t d
        if self._v.base == NULL or proc >= self._v.nprocs:
            return 0
        fp_arena_held(&self._v, proc, &n, &d)
        return n

    def usage(self):
        """Bytes in blocks referenced by someone, in freed blocks, and the budget.

        Raises RegionCorrupt when a region's chain is damaged."""
        return self._usage(True)


cdef class Block:
    """One reference of this process on one block; exports its bytes as a buffer.

    Its offset, generation and length are private copies taken when it was
    made: nothing a process writes into the shared header later changes them."""

    @property
    def address(self):
        return <size_t>self.data

    @property
    def owner(self):
        return self.arena

    def __getbuffer__(self, Py_buffer *buf, int flags):
        if (flags & PyBUF_WRITABLE) and self.readonly:
            raise BufferError("this shared array was shared read-only")
        buf.buf = self.data
        buf.obj = self
        buf.len = <Py_ssize_t>self.nbytes
        buf.readonly = self.readonly
        buf.itemsize = 1
        if flags & PyBUF_FORMAT:
            buf.format = b"B"
        else:
            buf.format = NULL
        buf.ndim = 1
        buf.shape = self._shape
        buf.strides = self._strides
        buf.suboffsets = NULL
        buf.internal = NULL

    def __releasebuffer__(self, Py_buffer *buf):
        pass

    def __reduce__(self):
        raise TypeError("a shared block crosses processes only as part of an ndarray")

    def __dealloc__(self):
        cdef Arena a = self.arena
        cdef uint64_t i
        if a is not None:
            if a._v.base != NULL:
                fp_arena_unref(&a._v, a.proc, self.off)
            if self._own:
                a._dropped_own(self.nbytes)
            if self._own and a._held != NULL:
                i = (self.off - a._own_base()) // FP_ARENA_PAGE
                if a._held[i]:
                    a._held[i] -= 1
            a._blocks -= 1
            a._maybe_unmap()


def _disown_after_fork():
    # os.register_at_fork(after_in_child=...): the child runs one thread, this one.
    arenas = [ref() for ref in _registry.values()]
    _registry.clear()
    for arena in arenas:
        if arena is not None:
            (<Arena>arena)._disown()


os.register_at_fork(after_in_child=_disown_after_fork)
