# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The arena: one pool's reference-counted shared blocks, over one sparse memfd.

    parent (pool.py, _codec)                      worker (_worker.py, _codec)
    ------------------------                      ---------------------------
    Arena.create(nworkers, budget)  --fd at spawn--> Arena.attach(fd, 1 + slot)
    alloc(n) -> Block in region 0                    alloc(n) -> Block in region 1 + slot
    Block in a call's pins ---(off, gen) in ring---> ref(off, gen) -> Block (own counter)
    ref(off, gen) + unref_for(w) <--(off, gen)------ handoff(off): +1 the parent takes over
    reclaim(slot) after the worker died

A Block holds one reference of its process and exports the block's bytes as a
buffer; ndarrays are views over it, so the block lives while any view does.
A Block also keeps its Arena object, hence the mapping, alive: an array used
after its pool shut down is still plain memory, never a dangling pointer.
"""

import os
import random
import weakref

from libc.stdint cimport uint32_t, uint64_t
from cpython.buffer cimport PyBUF_WRITABLE, PyBUF_FORMAT
from cpython.ref cimport PyObject

from fastpool import errors

from fastpool._sys cimport (
    EINVAL, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FP_CORRUPT, FP_OK, MAP_FAILED, MAP_NORESERVE,
    MAP_SHARED, PROT_READ, PROT_WRITE, close, errno, fallocate, fp_a64, fp_load64_acquire, ftruncate,
    madvise, mmap, munmap, pread,
)

cdef extern from "fp_arena.h" nogil:
    int FP_NOSPACE, FP_STALE
    ctypedef struct fp_arena_t:
        uint64_t magic
        uint32_t nprocs
        uint64_t region_size
        uint64_t budget
        uint64_t total_size
        uint64_t token
        uint64_t regions_offset
    uint64_t fp_arena_hdr_size(uint32_t nprocs)
    uint64_t fp_arena_size(uint32_t nprocs, uint64_t region_size)
    int fp_arena_init(fp_arena_t *a, uint32_t nprocs, uint64_t region_size, uint64_t budget, uint64_t token)
    int fp_arena_check(const fp_arena_t *a, uint64_t mapped)
    int fp_arena_alloc(fp_arena_t *a, uint32_t p, uint64_t nbytes, uint64_t *out_off, uint64_t *fresh_off,
                       uint64_t *fresh_len)
    void fp_arena_unbump(fp_arena_t *a, uint32_t p, uint64_t off)
    int fp_arena_ref(fp_arena_t *a, uint32_t p, uint64_t off, uint64_t gen)
    void fp_arena_unref(fp_arena_t *a, uint32_t p, uint64_t off)
    uint32_t fp_arena_count(fp_arena_t *a, uint32_t p, uint64_t off)
    uint64_t fp_arena_reclaim(fp_arena_t *a, uint32_t p)
    void fp_arena_usage(fp_arena_t *a, uint64_t *live, uint64_t *idle, uint64_t *nlive)
    ctypedef struct fp_block_t:
        fp_a64 gen
        fp_a64 size
    fp_block_t *fp_arena_block(fp_arena_t *a, uint64_t off)
    fp_a64 *fp_arena_top(fp_arena_t *a, uint32_t p)
    int fp_block_free(fp_block_t *b, uint32_t nprocs)

# Detaching an ndarray in place (fastpool.transfer): NumPy has no API to take
# the memory away from an array object, so this writes its fields: every
# dimension becomes 0, data points at a static zeroed buffer, WRITEABLE is
# cleared, the base (the Block, hence this process's reference) is dropped,
# and the object's type becomes DetachedArray, whose methods raise.  Any path
# DetachedArray does not cover sees a zero-length read-only array: never the
# bytes the task now owns.
cdef extern from *:
    """
    #include <numpy/ndarraytypes.h>
    static char fp_detached_data[256] __attribute__((aligned(64)));
    static int fp_detach_array(PyObject *arr, PyObject *newtype)
    {
        PyArrayObject_fields *f = (PyArrayObject_fields *)arr;
        PyObject *old_base = f->base;
        PyTypeObject *old_type = Py_TYPE(arr);
        if (f->nd < 1 || (f->flags & NPY_ARRAY_OWNDATA))
            return -1;
        for (int i = 0; i < f->nd; i++)
            f->dimensions[i] = 0;
        f->data = fp_detached_data;
        f->flags &= ~NPY_ARRAY_WRITEABLE;
        f->base = NULL;
        PyTypeObject *nt = (PyTypeObject *)newtype;
        if (nt->tp_basicsize == old_type->tp_basicsize &&
            (nt->tp_flags & Py_TPFLAGS_HAVE_GC) == (old_type->tp_flags & Py_TPFLAGS_HAVE_GC)) {
            Py_INCREF(newtype);
            Py_SET_TYPE(arr, (PyTypeObject *)newtype);
            if (old_type->tp_flags & Py_TPFLAGS_HEAPTYPE)
                Py_DECREF(old_type);
        }
        Py_XDECREF(old_base);
        return 0;
    }
    /* A class statement gives its instances a GC header, which an ndarray
     * allocated by NumPy lacks; DetachedArray adds no fields, so its
     * instances are made plain like ndarray's before any is swapped in. */
    static void fp_plain_instances(PyObject *newtype)
    {
        PyTypeObject *t = (PyTypeObject *)newtype;
        if (t->tp_flags & Py_TPFLAGS_HAVE_GC) {
            t->tp_flags &= ~Py_TPFLAGS_HAVE_GC;
            t->tp_free = PyObject_Free;
            t->tp_traverse = NULL;
            t->tp_clear = NULL;
        }
    }
    """
    int fp_detach_array(object arr, object newtype)
    void fp_plain_instances(object newtype)

DEF MADV_POPULATE_WRITE = 23

PARENT = 0
ARENA_MAX_DEFAULT_BYTES = 64 << 30
MEMINFO_CHECK_BYTES = 16 << 20  # fresh blocks this large check MemAvailable first

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


cdef class Arena:
    """One mapping of a pool's arena.  The parent creates it; each worker attaches by fd.

    Thread safety: alloc, ref and the Block methods run with the GIL held and
    never release it, so the one-allocator-per-region rule holds per process.
    """

    cdef fp_arena_t *_a
    cdef size_t _size
    cdef int _fd
    cdef readonly uint32_t proc
    cdef readonly uint64_t token
    cdef readonly bint closed
    cdef Py_ssize_t _blocks  # live Block objects: the mapping outlives close() while any exists
    cdef object __weakref__

    def __cinit__(self):
        self._a = NULL
        self._fd = -1

    @staticmethod
    def create(int nworkers, uint64_t budget, str name="fastpool-arena"):
        """A fresh arena in a new memfd (nothing in /dev/shm).  Each region may
        hold the whole budget: the budget, not the region, limits what is used."""
        cdef Arena self = Arena.__new__(Arena)
        cdef uint32_t nprocs = nworkers + 1
        if budget < (1 << 20):
            raise ValueError("arena_bytes must be at least 1 MiB")
        cdef uint64_t region = (budget + 4095) & ~(<uint64_t>4095)
        cdef uint64_t size = fp_arena_size(nprocs, region)
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            if ftruncate(fd, <long>size) != 0:
                raise errors.SharedMemoryError(
                    f"cannot size the shared arena to {size} bytes: {os.strerror(errno)}; pass a "
                    "smaller Pool(arena_bytes=...)")
            self._map(fd, size)
        except BaseException:
            os.close(fd)
            raise
        token = random.getrandbits(63) | 1
        if fp_arena_init(self._a, nprocs, region, budget, token) != FP_OK:
            raise errors.SegmentCorrupt("arena init: bad sizes")
        self.proc = PARENT
        self._register()
        return self

    @staticmethod
    def attach(int fd, uint32_t proc):
        """Maps an existing arena from an inherited fd (the fd stays the caller's)."""
        cdef Arena self = Arena.__new__(Arena)
        cdef fp_arena_t head
        if pread(fd, &head, sizeof(fp_arena_t), 0) != sizeof(fp_arena_t):
            raise errors.SegmentCorrupt("the shared arena is too short to be one")
        if fp_arena_check(&head, head.total_size if head.total_size < (1ULL << 46) else 0) != FP_OK:
            raise errors.SegmentCorrupt("the shared arena's magic or layout version does not match "
                                        "this fastpool build")
        if proc >= head.nprocs:
            raise errors.SegmentCorrupt(f"process index {proc} is outside the arena's {head.nprocs}")
        self._map(os.dup(fd), head.total_size)
        self.proc = proc
        self._register()
        return self

    cdef _map(self, int fd, uint64_t size):
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
        if p == MAP_FAILED:
            raise errors.SharedMemoryError(f"cannot map the shared arena ({size} bytes): {os.strerror(errno)}")
        self._a = <fp_arena_t *>p
        self._size = size
        self._fd = fd

    cdef _register(self):
        self.token = self._a.token
        _registry[self.token] = weakref.ref(self)

    def fileno(self):
        return self._fd

    @property
    def budget(self):
        return self._a.budget if self._a != NULL else 0

    def close(self):
        """Closes the fd and stops new references.  Free blocks' pages are given
        back now; the mapping goes when the last Block of this process does, so
        arrays still held stay valid memory.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        if _registry.get(self.token) is not None and _registry[self.token]() is self:
            del _registry[self.token]
        if self._fd >= 0:
            if self._a != NULL:
                self._punch_free()
            close(self._fd)
            self._fd = -1
        self._maybe_unmap()

    cdef _punch_free(self):
        cdef uint32_t r
        cdef uint64_t base, end, off, s
        cdef fp_block_t *b
        for r in range(self._a.nprocs):
            base = self._a.regions_offset + r * self._a.region_size
            end = base + fp_load64_acquire(fp_arena_top(self._a, r))
            off = base
            while off < end:
                b = fp_arena_block(self._a, off)
                s = fp_load64_acquire(&b.size)
                if s < 4096 or off + s > end:
                    break
                if fp_block_free(b, self._a.nprocs):
                    fallocate(self._fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, <long>(off + 4096),
                              <long>(s - 4096))
                off += s

    cdef _maybe_unmap(self):
        if self.closed and self._blocks == 0 and self._a != NULL:
            munmap(self._a, self._size)
            self._a = NULL

    def __dealloc__(self):
        if self._a != NULL:
            munmap(self._a, self._size)
        if self._fd >= 0:
            close(self._fd)

    cdef Block _block(self, uint64_t off, bint readonly):
        cdef Block blk = Block.__new__(Block)
        cdef uint64_t hdr = fp_arena_hdr_size(self._a.nprocs)
        blk.arena = self
        blk.off = off
        blk.gen = fp_load64_acquire(&fp_arena_block(self._a, off).gen)
        blk.nbytes = fp_load64_acquire(&fp_arena_block(self._a, off).size) - hdr
        blk.data = (<char *>self._a) + off + hdr
        blk.readonly = readonly
        blk._shape[0] = <Py_ssize_t>blk.nbytes
        blk._strides[0] = 1
        self._blocks += 1
        return blk

    cdef int _usable(self) except -1:
        if self.closed or self._a == NULL:
            raise errors.PoolClosed("this pool's shared memory is closed: the pool was shut down")
        return 0

    cpdef Block alloc(self, uint64_t nbytes):
        """A block of at least nbytes in this process's region, holding its reference.

        Raises SharedMemoryError, before touching anything, when the arena's
        budget or the machine's free memory cannot hold it."""
        self._usable()
        cdef uint64_t off = 0, fresh_off = 0, fresh_len = 0
        cdef int rc = fp_arena_alloc(self._a, self.proc, nbytes, &off, &fresh_off, &fresh_len)
        if rc == FP_NOSPACE:
            raise self._nospace(nbytes, "")
        if rc != FP_OK:
            raise errors.SegmentCorrupt(f"arena allocator status {rc}: its block chain is damaged")
        if fresh_len:
            try:
                self._commit(fresh_off, fresh_len, nbytes)
            except BaseException:
                fp_arena_unbump(self._a, self.proc, off)
                raise
        return self._block(off, False)

    cdef _commit(self, uint64_t off, uint64_t length, uint64_t nbytes):
        # Fresh pages are taken now, where failure is an exception: a page the
        # kernel cannot supply on first touch is a SIGBUS in whoever touches it.
        # MADV_POPULATE_WRITE also maps them here, so the first copy into the
        # block runs at memcpy speed instead of faulting page by page.
        cdef int rc
        if length >= MEMINFO_CHECK_BYTES:
            avail = mem_available_bytes()
            if avail is not None and length > avail:
                raise self._nospace(nbytes, f"the machine has {_mib(avail)} available")
        with nogil:
            rc = madvise((<char *>self._a) + off, length, MADV_POPULATE_WRITE)
        if rc != 0 and errno == EINVAL and self._fd >= 0:  # kernel older than 5.14
            with nogil:
                rc = fallocate(self._fd, 0, <long>off, <long>length)
        if rc != 0:
            raise self._nospace(nbytes, f"the kernel refused the pages: {os.strerror(errno)}")

    def _nospace(self, uint64_t nbytes, str why):
        u = self.usage()
        return errors.SharedMemoryError(
            f"cannot place {_mib(nbytes)} in the pool's shared memory: {_mib(u['live_bytes'])} of its "
            f"{_mib(u['budget_bytes'])} budget is in use by live arrays, {_mib(u['free_bytes'])} is free "
            f"in freed blocks{'; ' + why if why else ''}. Drop shared arrays you no longer need, or "
            "create the pool with a larger Pool(arena_bytes=...) (default: half the available memory, "
            "at most 64 GiB); in a container, raise its memory limit")

    cpdef Block ref(self, uint64_t off, uint64_t gen, bint readonly):
        """This process's own reference on a block named by a descriptor."""
        self._usable()
        cdef int rc = fp_arena_ref(self._a, self.proc, off, gen)
        if rc == FP_STALE:
            raise errors.SharedMemoryError(
                f"shared block at {off} was reused before this descriptor was read (fastpool bug)")
        if rc != FP_OK:
            raise errors.SegmentCorrupt(f"no shared block at offset {off}")
        return self._block(off, readonly)

    def handoff(self, Block blk):
        """One more reference for this process, that the receiver drops (unref_for)."""
        self._usable()
        fp_arena_ref(self._a, self.proc, blk.off, blk.gen)

    def unref_for(self, uint32_t proc, uint64_t off):
        if self._a != NULL and proc < self._a.nprocs:
            fp_arena_unref(self._a, proc, off)

    def count(self, uint32_t proc, uint64_t off):
        """References process proc holds on the block at off (tests, telemetry)."""
        return fp_arena_count(self._a, proc, off) if self._a != NULL else 0

    def is_free(self, uint64_t off):
        return bool(fp_block_free(fp_arena_block(self._a, off), self._a.nprocs))

    def reclaim(self, int slot):
        """Drops every reference worker slot held (it died).  Returns how many blocks it held."""
        if self._a == NULL or slot < 0 or slot + 1 >= <int>self._a.nprocs:
            return 0
        return fp_arena_reclaim(self._a, slot + 1)

    def usage(self):
        """Bytes in blocks referenced by someone, in freed blocks, and the budget."""
        cdef uint64_t live = 0, idle = 0, nlive = 0
        if self._a == NULL:
            return dict(live_bytes=0, free_bytes=0, live_blocks=0, budget_bytes=0, unused_bytes=0)
        fp_arena_usage(self._a, &live, &idle, &nlive)
        budget = self._a.budget
        return dict(live_bytes=live, free_bytes=idle, live_blocks=nlive, budget_bytes=budget,
                    unused_bytes=max(0, budget - live - idle))


cdef class Block:
    """One reference of this process on one block; exports its bytes as a buffer."""

    cdef Arena arena
    cdef readonly uint64_t off
    cdef readonly uint64_t gen
    cdef readonly uint64_t nbytes
    cdef readonly bint readonly
    cdef char *data
    cdef Py_ssize_t _shape[1]
    cdef Py_ssize_t _strides[1]

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
        if a is not None:
            if a._a != NULL:
                fp_arena_unref(a._a, a.proc, self.off)
            a._blocks -= 1
            a._maybe_unmap()


def plain_instances(newtype):
    """Makes newtype's instances GC-free like ndarray's (see fp_plain_instances)."""
    fp_plain_instances(newtype)


def detach(arr, newtype):
    """Takes the memory away from ndarray arr in place (see fp_detach_array)."""
    if fp_detach_array(arr, newtype) != 0:
        raise TypeError("only views of shared memory with at least one dimension can be transferred")


def rebuild(uint64_t token, uint64_t off, uint64_t gen, Py_ssize_t byte_off, dtype, shape, strides,
            bint readonly, int src):
    """Unpickles a descriptor (see _codec): a view of the block from this process's mapping.

    src >= 0: the sender (a worker) added a reference for the trip; it is dropped
    now that this process holds its own."""
    arena = lookup(token)
    if arena is None:
        raise errors.SharedMemoryError(
            "this array lives in the shared memory of a pool that is shut down, or of another pool "
            "than the one this process serves; pass it by value (np.array(arr)) instead")
    blk = (<Arena>arena).ref(off, gen, readonly)
    if src >= 0:
        (<Arena>arena).unref_for(<uint32_t>src, off)
    import numpy
    arr = numpy.ndarray(shape, dtype, buffer=blk, offset=byte_off, strides=strides)
    if readonly:
        arr.flags.writeable = False
    return arr


def new_array(Arena arena, shape, dtype, order="C", bint zero=False):
    """An ndarray over a fresh block of arena (pool.empty / pool.zeros)."""
    import numpy
    dt = numpy.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot live in shared memory; "
                        "use a numeric or structured dtype without object fields")
    if order not in ("C", "F"):
        raise ValueError("order must be 'C' or 'F'")
    shp = (int(shape),) if isinstance(shape, (int, numpy.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shp):
        raise ValueError(f"negative dimensions are not allowed: {shp}")
    n = dt.itemsize
    for s in shp:
        n *= s
    blk = arena.alloc(n)
    arr = numpy.ndarray(shp, dt, buffer=blk, order=order)
    if zero and n:
        # a reused block holds old bytes; a fresh one is zero already, but cheap to be sure
        numpy.frombuffer(blk, numpy.uint8, n)[:] = 0
    return arr


def share(Arena arena, arr, bint readonly=False):
    """A copy of arr in arena (pool.share): the one copy in, then descriptors only."""
    import numpy
    src = numpy.asarray(arr)
    order = "F" if src.flags.f_contiguous and not src.flags.c_contiguous else "C"
    out = new_array(arena, src.shape, src.dtype, order)
    numpy.copyto(out, src, casting="no")
    if readonly:
        out.flags.writeable = False
    return out
