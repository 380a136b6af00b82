# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""NumPy's allocator in a worker: large arrays are made in the worker's own arena region (NEP 49).

    worker start   _arrays.set_process_arena(arena) -> install(arena)   (never in the parent)
    task           r = arr * 2: NumPy -> _malloc(256 MiB) -> a block of region 1 + slot,
                   its pages mapped already when the block is reused (no fresh-page faults)
    serve          owned_roots(result): the hook arrays that only the result holds
    encode         _arrays.ArrayPickler: adopt(root) -> a Block on that block -> handoff ->
                   descriptor,
                   no copy (an array the worker also keeps elsewhere is copied as before)
    serve          result = None: NumPy -> _free(ptr): the worker's reference is dropped,
                   the parent's (the handoff) keeps the block until its array goes

Without the hook, a worker's new 256 MiB result costs fresh pages (first-touch
faults, the kernel zeroing them) and then a copy into the arena; with it, the
result lands in shared memory in the first place, in a block whose pages the
previous task already faulted in.

Lifetime.  A hook block is an ordinary arena block whose reference (this
process's counter) the ndarray's data holds instead of a Block: NumPy keeps
the handler with each array and calls _free when the array goes, whatever
handler is current then, so the reference always comes back.  Views keep
their base, hence the data, alive as for any array.  The parent maps the
block through its own counter, taken before the worker's is dropped.

What the hook never does:
- serve the parent: install() refuses region 0 (the parent's arrays are the user's);
- fail an allocation malloc would satisfy: a small request (< min_bytes), an
  arena that is full (the hook may commit at most cap_bytes of the budget, half
  by default, so the parent's share() keeps room), a worker thread without the
  GIL, a forked child of the worker (its pid differs) or pages the kernel
  refuses all go to the handler that was current before (NumPy's default);
- zero memory for calloc: np.zeros keeps malloc's lazy zero pages (object
  arrays, which NumPy zero-fills, never land in a hook block either);
- give pages back when a block is freed: they stay mapped for the next task's
  array ("warm"), so a worker's RSS keeps its largest concurrent arrays while
  the pool lives (at most cap_bytes, all workers together); memory_limit counts them.
  Killing the worker does not free them (the pool's memfd holds them): the
  parent gives them back when it reclaims the dead worker's region.

NumPy calls the handler with the GIL held; _free also copes without it
(PyGILState_Ensure), since the bookkeeping it touches is the GIL's.  Its
handler is a context variable: install() sets it in the calling thread's
context (the worker's main thread, where tasks run); threads a task starts
begin with NumPy's default, and their arrays are copied into the arena as
before.  FASTPOOL_NUMPY_HOOK=0 in a worker's environment turns it off.
"""

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport PyObject
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, strncpy

from fastpool._native._arena cimport (
    FP_ARENA_PAGE, MADV_POPULATE_WRITE, Arena, fp_arena_alloc_capped, fp_arena_blk_t,
    fp_arena_damage_t, fp_arena_unbump,
    fp_arena_unref, fp_arena_view_t,
)
from fastpool._native._sys cimport EINVAL, FP_OK, errno, fallocate, madvise

cdef extern from "<unistd.h>" nogil:
    int getpid()

cdef extern from "Python.h" nogil:
    ctypedef int PyGILState_STATE
    int PyGILState_Check()
    PyGILState_STATE PyGILState_Ensure()
    void PyGILState_Release(PyGILState_STATE st)

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(PyObject *o)
    Py_ssize_t PyTuple_GET_SIZE(PyObject *o)
    PyObject *PyTuple_GET_ITEM(PyObject *o, Py_ssize_t i)
    Py_ssize_t PyList_GET_SIZE(PyObject *o)
    PyObject *PyList_GET_ITEM(PyObject *o, Py_ssize_t i)
    bint PyTuple_CheckExact(PyObject *o)
    bint PyList_CheckExact(PyObject *o)
    bint PyDict_CheckExact(PyObject *o)
    int PyDict_Next(PyObject *d, Py_ssize_t *pos, PyObject **key, PyObject **value)

cdef extern from "numpy/arrayobject.h":
    ctypedef struct PyDataMemAllocator:
        void *ctx
        void *(*malloc)(void *ctx, size_t size) noexcept nogil
        void *(*calloc)(void *ctx, size_t nelem, size_t elsize) noexcept nogil
        void *(*realloc)(void *ctx, void *ptr, size_t new_size) noexcept nogil
        void (*free)(void *ctx, void *ptr, size_t size) noexcept nogil
    ctypedef struct PyDataMem_Handler:
        char name[127]
        uint8_t version
        PyDataMemAllocator allocator
    ctypedef struct PyArrayObject:
        pass
    object PyDataMem_SetHandler(object handler)
    int _import_array() except -1
    bint PyArray_CheckExact(PyObject *o)
    void *PyArray_DATA(PyArrayObject *arr)
    PyObject *PyArray_BASE(PyArrayObject *arr)

# owned_roots looks this deep into tuples, lists and dicts.  Dask's local scheduler
# wraps each task's value three deep ([(key, (value, id), failed)]): 5 leaves a task's
# own tuple or dict of arrays two levels.  The walk visits nothing pickling
# the result would not visit anyway, so depth costs only what the result holds.
cdef enum:
    WALK_DEPTH = 5
    WALK_ITEMS = 256     # and at containers this long at most: a longer one is copied

MIN_BYTES = 1 << 20      # smaller arrays stay with malloc: they travel inline, or cost a short copy

ctypedef struct hook_rec:
    uint64_t gen         # the block's generation; 0: no hook block starts on this page
    uint64_t size        # the whole block, header included

# One hook per process, on one arena: plain C state that _malloc and _free read
# without the GIL.  The pointers point into the Arena object, which _arena keeps
# alive (and mapped: install() holds one of its Block counts) for good.
cdef fp_arena_view_t *_v = NULL
cdef uint64_t *_own_top = NULL
cdef uint32_t *_held = NULL
cdef Py_ssize_t *_blocks = NULL
cdef bint *_closed = NULL
cdef int *_fd = NULL
cdef hook_rec *_recs = NULL      # per page of the own region (calloc: untouched pages cost nothing)
cdef uint64_t _lo = 0, _hi = 0   # the own region, as arena offsets
cdef uint32_t _proc = 0
cdef int _pid = 0
cdef size_t _min_bytes = MIN_BYTES
cdef uint64_t _cap = 0
cdef bint _serving = False
cdef Py_ssize_t _live = 0
cdef uint64_t _served = 0, _fallbacks = 0
cdef PyDataMemAllocator _prev
cdef PyDataMem_Handler _handler
cdef object _arena = None
cdef object _capsule = None
cdef object _prev_capsule = None
cdef bint _numpy_ready = False


cdef inline Py_ssize_t _page_of(const void *p) noexcept nogil:
    # The own-region page of the hook block whose data starts at p, or -1.
    cdef uint64_t a
    if _recs == NULL or <const char *>p < <const char *>_v.base:
        return -1
    a = <uint64_t>(<const char *>p - <const char *>_v.base)
    if a < _lo + _v.hdr or a >= _hi:
        return -1
    a -= _v.hdr
    if a % FP_ARENA_PAGE:
        return -1
    a = (a - _lo) // FP_ARENA_PAGE
    return <Py_ssize_t>a if _recs[a].gen else -1


cdef void *_take(size_t n) noexcept nogil:
    # A hook block of at least n data bytes, or NULL: the caller falls back.
    global _live, _served
    cdef fp_arena_blk_t b
    cdef fp_arena_damage_t d
    cdef uint64_t fresh = 0, i, first
    cdef int rc
    if not _serving or _closed[0] or _v.base == NULL or PyGILState_Check() != 1 or getpid() != _pid:
        return NULL
    if fp_arena_alloc_capped(_v, _proc, n, _cap, &b, &fresh, _own_top, &d) != FP_OK:
        return NULL  # full (or a damaged region: Arena.alloc reports that, malloc serves here)
    first = (b.off - _lo) // FP_ARENA_PAGE
    if fresh:
        # Take the pages now, where failure is a fallback: a page the kernel cannot
        # supply on first touch would be a SIGBUS in the task.
        rc = madvise(_v.base + b.off, fresh, MADV_POPULATE_WRITE)
        if rc != 0 and errno == EINVAL and _fd[0] >= 0:  # kernel older than 5.14
            rc = fallocate(_fd[0], 0, <long>b.off, <long>fresh)
        if rc != 0:
            fp_arena_unbump(_v, _proc, &b, _own_top)
            return NULL
    else:
        for i in range(first, first + b.size // FP_ARENA_PAGE):
            if _held[i]:  # free by its counts, yet held here: see Arena._holds_any
                fp_arena_unref(_v, _proc, b.off)
                return NULL
    _held[first] += 1
    _blocks[0] += 1
    _recs[first].gen = b.gen
    _recs[first].size = b.size
    _live += 1
    _served += 1
    return _v.base + b.off + _v.hdr


cdef bint _give_back(void *p) noexcept nogil:
    # True when p was a hook block's data (its reference is dropped here).
    global _live
    cdef Py_ssize_t page = _page_of(p)
    cdef PyGILState_STATE st
    cdef bint gil
    if page < 0:
        return False
    if getpid() != _pid:
        return True  # inherited by a forked child: the reference is the worker's, not its own
    gil = PyGILState_Check() == 1
    if not gil:
        st = PyGILState_Ensure()
    _recs[page].gen = 0
    if _held[page]:
        _held[page] -= 1
    _blocks[0] -= 1
    _live -= 1
    fp_arena_unref(_v, _proc, _lo + <uint64_t>page * FP_ARENA_PAGE)
    if not gil:
        PyGILState_Release(st)
    return True


cdef void *_malloc(void *ctx, size_t n) noexcept nogil:
    global _fallbacks
    cdef void *p
    if n >= _min_bytes:
        p = _take(n)
        if p != NULL:
            return p
        _fallbacks += 1
    return _prev.malloc(_prev.ctx, n)


cdef void *_calloc(void *ctx, size_t nelem, size_t elsize) noexcept nogil:
    return _prev.calloc(_prev.ctx, nelem, elsize)


cdef void *_realloc(void *ctx, void *p, size_t n) noexcept nogil:
    cdef Py_ssize_t page
    cdef size_t have
    cdef void *q
    if p == NULL:
        return _malloc(ctx, n)
    page = _page_of(p)
    if page < 0:
        return _prev.realloc(_prev.ctx, p, n)
    have = <size_t>(_recs[page].size - _v.hdr)
    if n <= have and n >= have // 2 and getpid() == _pid:
        return p
    q = _malloc(ctx, n)
    if q == NULL:
        return NULL
    memcpy(q, p, n if n < have else have)
    _give_back(p)
    return q


cdef void _free(void *ctx, void *p, size_t n) noexcept nogil:
    if not _give_back(p):
        _prev.free(_prev.ctx, p, n)


def install(Arena arena not None, min_bytes=MIN_BYTES, cap_bytes=None):
    """Makes NumPy allocate arrays of at least min_bytes in arena's region of this
    process, in the calling thread's context, until uninstall().

    cap_bytes (default: half the budget): the hook never bumps the arena's
    committed bytes past it.  Raises ValueError for the parent's arena view
    (region 0), RuntimeError when another arena's hook blocks are still alive
    in this process or another NEP 49 handler is current, MemoryError when the
    bookkeeping cannot be allocated."""
    global _v, _own_top, _held, _blocks, _closed, _fd, _recs
    global _lo, _hi, _proc, _pid, _min_bytes, _cap
    global _serving, _arena, _capsule, _prev_capsule, _prev, _numpy_ready
    if arena.proc == 0:
        raise ValueError(
            "the parent never allocates NumPy arrays in the arena: they are the user's")
    if arena.closed:
        raise ValueError("this arena is closed")
    if not _numpy_ready:
        _import_array()
        _numpy_ready = True
    cdef uint64_t pages = arena._v.region_size // FP_ARENA_PAGE
    cdef hook_rec *recs
    if _arena is not arena:
        if _live:
            raise RuntimeError(f"{_live} NumPy arrays still live in another arena's hook blocks")
        if arena._held == NULL:
            arena._held = <uint32_t *>calloc(pages, sizeof(uint32_t))
        recs = <hook_rec *>calloc(pages, sizeof(hook_rec))
        if arena._held == NULL or recs == NULL:
            free(recs)
            raise MemoryError("no memory for the NumPy hook's block table")
        free(_recs)
        _recs = recs
        if _arena is not None:  # its hook arrays are all gone: give its mapping back
            (<Arena>_arena)._blocks -= 1
            (<Arena>_arena)._maybe_unmap()
        _v, _own_top, _held, _blocks = &arena._v, &arena._own_top, arena._held, &arena._blocks
        _closed, _fd, _proc = &arena.closed, &arena._fd, arena.proc
        _lo = arena._v.regions_offset + <uint64_t>arena.proc * arena._v.region_size
        _hi = _lo + arena._v.region_size
        arena._blocks += 1  # the mapping stays while NumPy may hold pointers into it
        _arena = arena
    _min_bytes = <size_t>min_bytes if min_bytes > 0 else 1
    _cap = arena._v.budget // 2 if cap_bytes is None else <uint64_t>cap_bytes
    if _capsule is None:
        strncpy(_handler.name, b"fastpool_arena", 126)
        _handler.version = 1
        _handler.allocator.ctx = NULL
        _handler.allocator.malloc = _malloc
        _handler.allocator.calloc = _calloc
        _handler.allocator.realloc = _realloc
        _handler.allocator.free = _free
        _capsule = PyCapsule_New(&_handler, b"mem_handler", NULL)
    old = PyDataMem_SetHandler(_capsule)
    if old is not _capsule:
        if _prev_capsule is None:
            # Arrays this hook hands to malloc go back to the same handler's free.
            _prev = (<PyDataMem_Handler *>PyCapsule_GetPointer(old, b"mem_handler")).allocator
            _prev_capsule = old
        elif old is not _prev_capsule:
            PyDataMem_SetHandler(old)
            raise RuntimeError("another NEP 49 memory handler is current in this context")
    _pid = getpid()
    _serving = True


def uninstall():
    """Gives the calling context back the handler that was current before install().
    Arrays made by the hook keep it (NumPy stores it with each array) and still
    give their blocks back when they go."""
    global _serving
    _serving = False
    if _prev_capsule is not None:
        PyDataMem_SetHandler(_prev_capsule)


def stats():
    """live: hook arrays alive now; served: blocks handed to NumPy; fallbacks: requests
    of at least min_bytes that went to malloc (arena full, no GIL, forked child)."""
    return dict(installed=bool(_serving), live=_live, served=_served, fallbacks=_fallbacks,
                min_bytes=_min_bytes, cap_bytes=_cap, pid=_pid)


def adopt(arr):
    """A Block (this process's own reference) on the hook block ndarray arr owns, or None
    when arr's data is not one (then it is copied into the arena like any array)."""
    if _recs == NULL or not PyArray_CheckExact(<PyObject *>arr) or getpid() != _pid:
        return None
    cdef Py_ssize_t page = _page_of(PyArray_DATA(<PyArrayObject *><PyObject *>arr))
    if page < 0:
        return None
    return (<Arena>_arena).ref(_lo + <uint64_t>page * FP_ARENA_PAGE, _recs[page].gen, False)


cdef int _walk(PyObject *o, int depth, set found) except -1:
    # Reference counts are exact here: every object reached is held once, by the
    # result (serve's local) or by its container, or it is shared with someone.
    cdef PyObject *b
    cdef PyObject *key
    cdef PyObject *val
    cdef Py_ssize_t i, n, pos = 0
    if Py_REFCNT(o) != 1:
        return 0
    if PyArray_CheckExact(o):
        b = PyArray_BASE(<PyArrayObject *>o)
        while b != NULL:  # a view: each link held only by the one below it
            if not PyArray_CheckExact(b) or Py_REFCNT(b) != 1:
                return 0
            o = b
            b = PyArray_BASE(<PyArrayObject *>o)
        if _page_of(PyArray_DATA(<PyArrayObject *>o)) >= 0:
            found.add(<Py_ssize_t>o)  # id() of the root
        return 0
    if depth >= WALK_DEPTH:
        return 0
    if PyTuple_CheckExact(o):
        n = PyTuple_GET_SIZE(o)
        if n <= WALK_ITEMS:
            for i in range(n):
                _walk(PyTuple_GET_ITEM(o, i), depth + 1, found)
    elif PyList_CheckExact(o):
        n = PyList_GET_SIZE(o)
        if n <= WALK_ITEMS:
            for i in range(n):
                _walk(PyList_GET_ITEM(o, i), depth + 1, found)
    elif PyDict_CheckExact(o):
        n = 0
        while n < WALK_ITEMS and PyDict_Next(o, &pos, &key, &val):
            _walk(val, depth + 1, found)
            n += 1
    return 0


cdef object owned_roots(object result):
    """ids of the hook arrays only result holds (directly, through views, or in
    tuples, lists and dicts it alone holds), or None.  The caller passes its
    only reference: serve's local, borrowed into this call.  Anything held twice
    (a global, a cache, the same array twice in the result) is left out: the
    parent must get a copy of what the worker may still change."""
    if _live == 0 or getpid() != _pid:
        return None
    cdef set found = set()
    _walk(<PyObject *>result, 0, found)
    return found or None

