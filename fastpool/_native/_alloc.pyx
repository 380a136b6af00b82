# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""NumPy's allocator (NEP 49) over an arena region: large arrays are born in shared memory.

    worker start   _arrays.set_process_arena(arena) -> install(arena): region 1 + slot
    parent         with pool.arrays(): _arrays.ArraysContext -> enter(arena): region 0
    allocation     r = arr * 2: NumPy -> _malloc(h, 256 MiB) -> a block of the hook's region,
                   its pages mapped already when the block is reused (no fresh-page faults)
    worker serve   owned_roots(result): the hook arrays that only the result holds
    send           _arrays.ArrayPickler: adopt(root, arena) -> a Block on that block ->
                   descriptor, no copy (a worker's array it also keeps elsewhere is
                   copied as before; the parent's arrays are sent as pool.empty's are)
    free           NumPy -> _free(h, ptr): the hook array's reference is dropped; a
                   Block taken by adopt (the call's keep, a handoff) keeps the block

A hook is a C struct (hook_t) that carries its own NEP 49 handler, so NumPy's
ctx pointer names the hook, and each array (which keeps its handler's capsule)
names the hook and the arena its bytes are in, whatever handler is current when
it goes.  The capsule owns the struct, and the struct a reference to its Arena:
both live until no array made under the handler (hook block or malloc fallback)
and no Hook object (the worker's install, a pool.arrays() context) is left.
_hooks finds the live Hook of an arena, so that contexts of one pool share it.

Lifetime.  A hook block is an ordinary arena block whose reference (this
process's counter) the ndarray's data holds instead of a Block.  While any hook
array of an arena lives, the hook holds one of the Arena's Block counts, so the
mapping outlives the pool's shutdown (Arena.close): such an array stays valid
memory, and the mapping goes with the last one.  Views keep their base, hence
the data, alive as for any array.

What the hook never does:
- fail an allocation malloc would satisfy: a small request (< min_bytes), an
  arena that is full (the hook may commit at most cap_bytes of the budget: half
  in a worker, PARENT_CAP_SHARE in the parent, so that copies and results keep
  room), a closed arena (its pool was shut down), a thread without the GIL, a
  forked child (its pid differs) or pages the kernel refuses all go to the
  handler that was current when the hook was made (NumPy's default, usually);
- zero memory for calloc in a worker: np.zeros keeps malloc's lazy zero pages
  there; in the parent np.zeros lands in the arena too (fresh blocks are the
  kernel's zero pages, a reused one is cleared), so that it crosses without a copy;
- give pages back when a block is freed: they stay mapped for the next array
  ("warm") until the process's idle trim (Arena.trim, beyond its warm reserve), a
  worker's churn trim after a task (beyond what its recent tasks used: _serve.pyx,
  from freed_bytes and peak_bytes), the pool's close, or (a worker's) the parent's
  reclaim of its region after a death; a reused block whose pages a trim gave back
  takes them again at once.

NumPy calls the handler with the GIL held; _free also copes without it
(PyGILState_Ensure), since the bookkeeping it touches is the GIL's.  The
current handler is a context variable: install() and enter() set it in the
calling thread's context only; threads begin with NumPy's default.
FASTPOOL_NUMPY_HOOK=0 in a worker's environment turns the worker's hook off.
"""

import weakref

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset, strncpy

from fastpool._native._arena cimport (
    FP_ARENA_PAGE, Arena, fp_arena_alloc_capped, fp_arena_blk_t,
    fp_arena_damage_t, fp_arena_is_free, fp_arena_unbump,
    fp_arena_unref, fp_arena_view_t, fp_pages_commit, recommit,
)
from fastpool._native._sys cimport FP_OK

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
    object PyDataMem_GetHandler()
    int _import_array() except -1
    bint PyArray_CheckExact(PyObject *o)
    void *PyArray_DATA(PyArrayObject *arr)
    PyObject *PyArray_BASE(PyArrayObject *arr)
    int PyArray_FLAGS(PyArrayObject *arr)
    void PyArray_CLEARFLAGS(PyArrayObject *arr, int flags)
    int NPY_ARRAY_OWNDATA
    PyObject *PyArray_HANDLER(PyArrayObject *arr)
    int _PyArray_SetBaseObject "PyArray_SetBaseObject" (PyArrayObject *arr,
                                                        PyObject *base) except -1  # steals base

# owned_roots looks this deep into tuples, lists and dicts.  Dask's local scheduler
# wraps each task's value three deep ([(key, (value, id), failed)]): 5 leaves a task's
# own tuple or dict of arrays two levels.  The walk visits nothing pickling
# the result would not visit anyway, so depth costs only what the result holds.
cdef enum:
    WALK_DEPTH = 5
    WALK_ITEMS = 256     # and at containers this long at most: a longer one is copied

MIN_BYTES = 1 << 20      # smaller arrays stay with malloc: they travel inline, or cost a short copy
# The parent's hook may fill the budget up to this share; the rest stays for by-value
# copies, pool.empty and the workers' results, which fail (SharedMemoryError) without room.
PARENT_CAP_SHARE = 0.75
cdef const char *HANDLER_NAME = b"fastpool_arena"  # what np.core.multiarray.get_handler_name says

ctypedef struct hook_rec:
    uint64_t gen         # the block's generation; 0: no hook block starts on this page
    uint64_t size        # the whole block, header included

ctypedef struct hook_t:
    PyDataMem_Handler handler   # NumPy's view: its allocator's ctx is this struct
    PyDataMemAllocator prev     # the fallback, and the free of what it allocated
    PyObject *prev_capsule      # owned: keeps prev's context alive
    PyObject *arena             # owned: the pointers below point into it
    fp_arena_view_t *v
    uint64_t *own_top
    uint64_t *allocs            # the Arena's count of blocks taken (its trims watch it)
    uint64_t *npunched          # the Arena's count of pages a trim gave back
    uint32_t *held
    Py_ssize_t *blocks
    bint *closed
    int *fd
    hook_rec *recs              # per page of the region (calloc: untouched pages cost nothing)
    uint64_t lo, hi             # the region, as arena offsets
    uint64_t cap
    size_t min_bytes
    uint32_t proc
    int pid
    bint serving
    bint zero_too               # calloc lands in the arena as well (the parent's hook)
    Py_ssize_t live
    uint64_t served, fallbacks


cdef inline Py_ssize_t _page_of(hook_t *h, const void *p) noexcept nogil:
    # The region page of h's hook block whose data starts at p, or -1.
    cdef uint64_t a
    cdef fp_arena_view_t *v = h.v
    if v.base == NULL or <const char *>p < <const char *>v.base:
        return -1
    a = <uint64_t>(<const char *>p - <const char *>v.base)
    if a < h.lo + v.hdr or a >= h.hi:
        return -1
    a -= v.hdr
    if a % FP_ARENA_PAGE:
        return -1
    a = (a - h.lo) // FP_ARENA_PAGE
    return <Py_ssize_t>a if h.recs[a].gen else -1


cdef void *_take(hook_t *h, size_t n, bint *fresh_out) noexcept nogil:
    # A hook block of at least n data bytes, or NULL: the caller falls back.
    global _live_here, _peak_here
    cdef fp_arena_blk_t b
    cdef fp_arena_damage_t d
    cdef fp_arena_view_t *v = h.v
    cdef uint64_t fresh = 0, i, first
    cdef int rc = 0
    if (not h.serving or h.closed[0] or v.base == NULL
            or PyGILState_Check() != 1 or getpid() != h.pid):
        return NULL
    if fp_arena_alloc_capped(v, h.proc, n, h.cap, &b, &fresh, h.own_top, &d) != FP_OK:
        return NULL  # full (or a damaged region: Arena.alloc reports that, malloc serves here)
    first = (b.off - h.lo) // FP_ARENA_PAGE
    if fresh:
        # Take the pages now, where failure is a fallback: a page the kernel cannot
        # supply on first touch would be a SIGBUS in the task.
        if fp_pages_commit(h.fd[0], v.base, b.off, fresh) != 0:
            fp_arena_unbump(v, h.proc, &b, h.own_top)
            return NULL
    else:
        for i in range(first, first + b.size // FP_ARENA_PAGE):
            if h.held[i]:  # free by its counts, yet held here: see Arena._holds_any
                fp_arena_unref(v, h.proc, b.off)
                return NULL
        if h.npunched[0]:  # a trim gave some of its pages back: take them again now
            with gil:
                rc = recommit(<Arena>h.arena, b.off, b.size)
            if rc != 0:
                fp_arena_unref(v, h.proc, b.off)
                return NULL
    h.allocs[0] += 1
    _live_here += b.size
    if _live_here > _peak_here:
        _peak_here = _live_here
    if h.live == 0:
        # The first live hook array pins the mapping (one Block count), so it
        # outlives the pool's shutdown while any hook array lives.
        h.blocks[0] += 1
    h.held[first] += 1
    h.recs[first].gen = b.gen
    h.recs[first].size = b.size
    h.live += 1
    h.served += 1
    fresh_out[0] = fresh != 0
    return v.base + b.off + v.hdr


# What the worker's loop reads around each task (its churn trim, _serve.pyx), all hooks
# of this process together, written with the GIL held.  _freed_here: bytes of hook blocks
# whose array's free left them free, ever; a block someone else still references (a
# result handed to the parent, a Block taken on it) is not churn and is not counted.
# _live_here: bytes of hook blocks this process's arrays hold now; _peak_here: the most
# _live_here reached since task_mark().
cdef uint64_t _freed_here = 0
cdef uint64_t _live_here = 0
cdef uint64_t _peak_here = 0


cdef uint64_t freed_bytes() noexcept nogil:
    return _freed_here


cdef uint64_t task_mark() noexcept nogil:
    global _peak_here
    _peak_here = _live_here
    return _live_here


cdef uint64_t peak_bytes() noexcept nogil:
    return _peak_here


cdef bint _give_back(hook_t *h, void *p) noexcept nogil:
    # True when p was a hook block's data (its reference is dropped here).
    global _freed_here, _live_here
    cdef Py_ssize_t page = _page_of(h, p)
    cdef uint64_t off, size
    cdef int free_ = 0
    if page < 0:
        return False
    if getpid() != h.pid:
        return True  # inherited by a forked child: the reference is the parent's, not its own
    with gil:  # the bookkeeping is the GIL's; NumPy may free without it
        off = h.lo + <uint64_t>page * FP_ARENA_PAGE
        size = h.recs[page].size
        _live_here -= size if size <= _live_here else _live_here
        (<Arena>h.arena)._dropped_own(size)
        h.recs[page].gen = 0
        if h.held[page]:
            h.held[page] -= 1
        h.live -= 1
        fp_arena_unref(h.v, h.proc, off)
        if fp_arena_is_free(h.v, off, &free_) == FP_OK and free_:
            _freed_here += size
        if h.live == 0:  # the last one: unmap if the pool closed meanwhile
            h.blocks[0] -= 1
            (<Arena>h.arena)._maybe_unmap()
    return True


cdef void *_malloc(void *ctx, size_t n) noexcept nogil:
    cdef hook_t *h = <hook_t *>ctx
    cdef void *p
    cdef bint fresh = False
    if n >= h.min_bytes:
        p = _take(h, n, &fresh)
        if p != NULL:
            return p
        h.fallbacks += 1
    return h.prev.malloc(h.prev.ctx, n)


cdef void *_calloc(void *ctx, size_t nelem, size_t elsize) noexcept nogil:
    cdef hook_t *h = <hook_t *>ctx
    cdef size_t n
    cdef void *p
    cdef bint fresh = False
    if h.zero_too and elsize and nelem <= (<size_t>-1) // elsize:
        n = nelem * elsize
        if n >= h.min_bytes:
            p = _take(h, n, &fresh)
            if p != NULL:
                if not fresh:  # a fresh block is the kernel's zero pages already
                    memset(p, 0, n)
                return p
            h.fallbacks += 1
    return h.prev.calloc(h.prev.ctx, nelem, elsize)


cdef void *_realloc(void *ctx, void *p, size_t n) noexcept nogil:
    cdef hook_t *h = <hook_t *>ctx
    cdef Py_ssize_t page
    cdef size_t have
    cdef void *q
    if p == NULL:
        return _malloc(ctx, n)
    page = _page_of(h, p)
    if page < 0:
        return h.prev.realloc(h.prev.ctx, p, n)
    have = <size_t>(h.recs[page].size - h.v.hdr)
    if n <= have and n >= have // 2 and getpid() == h.pid:
        return p
    q = _malloc(ctx, n)
    if q == NULL:
        return NULL
    memcpy(q, p, n if n < have else have)
    _give_back(h, p)
    return q


cdef void _free(void *ctx, void *p, size_t n) noexcept nogil:
    cdef hook_t *h = <hook_t *>ctx
    if not _give_back(h, p):
        h.prev.free(h.prev.ctx, p, n)


cdef void _capsule_gone(object capsule) noexcept:
    # No array made under this handler is left (NumPy holds the capsule with each):
    # nothing can call into the hook again.
    cdef hook_t *h = <hook_t *>PyCapsule_GetPointer(capsule, b"mem_handler")
    if h != NULL:
        Py_XDECREF(h.prev_capsule)
        Py_XDECREF(h.arena)
        free(h.recs)
        free(h)


cdef bint _is_hook(object capsule):
    # NumPy names every handler capsule "mem_handler"; ours are those that call _malloc.
    cdef PyDataMem_Handler *hd = <PyDataMem_Handler *>PyCapsule_GetPointer(capsule,
                                                                           b"mem_handler")
    return hd != NULL and hd.allocator.malloc == _malloc


cdef class Hook:
    """One arena's NumPy handler in this process (see the module docstring)."""

    cdef hook_t *h
    cdef readonly object capsule  # holds h (and h its Arena) while this Hook lives
    cdef object __weakref__

    def stats(self):
        """live: hook arrays alive now; served: blocks handed to NumPy; fallbacks:
        requests of at least min_bytes that went to malloc (arena full or closed, no
        GIL, forked child)."""
        cdef hook_t *h = self.h
        return dict(installed=bool(h.serving), live=h.live, served=h.served,
                    fallbacks=h.fallbacks, min_bytes=h.min_bytes, cap_bytes=h.cap, pid=h.pid)


_hooks = weakref.WeakValueDictionary()  # arena token -> the live Hook of that arena here
_installed = None  # the worker's own hook (install), or None
cdef bint _numpy_ready = False


cdef Hook _hook_for(Arena arena):
    global _numpy_ready
    if arena.closed:
        raise ValueError("this arena is closed")
    got = _hooks.get(arena.token)
    if got is not None:
        return <Hook>got
    if not _numpy_ready:
        _import_array()
        _numpy_ready = True
    cdef uint64_t pages = arena._v.region_size // FP_ARENA_PAGE
    cdef hook_t *h = <hook_t *>calloc(1, sizeof(hook_t))
    if h != NULL:
        h.recs = <hook_rec *>calloc(pages, sizeof(hook_rec))
    if arena._held == NULL:
        arena._held = <uint32_t *>calloc(pages, sizeof(uint32_t))
    if h == NULL or h.recs == NULL or arena._held == NULL:
        if h != NULL:
            free(h.recs)
        free(h)
        raise MemoryError("no memory for the NumPy hook's block table")
    # The fallback: the handler current now, or the one behind it when that is a hook.
    cdef hook_t *prev_h
    cur = PyDataMem_GetHandler()
    if _is_hook(cur):
        prev_h = <hook_t *>PyCapsule_GetPointer(cur, b"mem_handler")
        h.prev = prev_h.prev
        h.prev_capsule = prev_h.prev_capsule
    else:
        h.prev = (<PyDataMem_Handler *>PyCapsule_GetPointer(cur, b"mem_handler")).allocator
        h.prev_capsule = <PyObject *>cur
    Py_INCREF(<object>h.prev_capsule)
    strncpy(h.handler.name, HANDLER_NAME, 126)
    h.handler.version = 1
    h.handler.allocator.ctx = h
    h.handler.allocator.malloc = _malloc
    h.handler.allocator.calloc = _calloc
    h.handler.allocator.realloc = _realloc
    h.handler.allocator.free = _free
    h.arena = <PyObject *>arena
    Py_INCREF(arena)
    h.v, h.own_top, h.held, h.blocks = &arena._v, &arena._own_top, arena._held, &arena._blocks
    h.closed, h.fd, h.proc = &arena.closed, &arena._fd, arena.proc
    h.allocs, h.npunched = &arena.allocs, &arena._npunched
    h.lo = arena._v.regions_offset + <uint64_t>arena.proc * arena._v.region_size
    h.hi = h.lo + arena._v.region_size
    h.pid = getpid()
    h.min_bytes = MIN_BYTES
    h.cap = arena._v.budget // 2
    cdef Hook hook = Hook.__new__(Hook)
    hook.h = h
    hook.capsule = PyCapsule_New(&h.handler, b"mem_handler", _capsule_gone)
    _hooks[arena.token] = hook
    return hook


cdef bint _owns(hook_t *h, object arr, Py_ssize_t *page):
    # True when ndarray arr's data starts h's hook block at region page *page.
    if not PyArray_CheckExact(<PyObject *>arr) or getpid() != h.pid:
        return False
    page[0] = _page_of(h, PyArray_DATA(<PyArrayObject *><PyObject *>arr))
    return page[0] >= 0


cdef hook_t *_hook_of_array(object arr, Arena arena, Py_ssize_t *page):
    # The hook whose block arr's data starts, found through the handler NumPy keeps
    # with arr; NULL unless it is a hook of this process, of arena (None: the
    # worker's install).  Before the first hook, NumPy's C API is not imported here
    # (PyArray_CheckExact would read a NULL table), and no hook array exists anyway.
    if not _numpy_ready or not PyArray_CheckExact(<PyObject *>arr):
        return NULL
    cdef PyObject *cap = PyArray_HANDLER(<PyArrayObject *><PyObject *>arr)
    if cap == NULL or not _is_hook(<object>cap):
        return NULL
    cdef hook_t *h = <hook_t *>PyCapsule_GetPointer(<object>cap, b"mem_handler")
    if arena is None:
        if _installed is None or h != (<Hook>_installed).h:
            return NULL
    elif h.arena != <PyObject *>arena:
        return NULL
    return h if _owns(h, arr, page) else NULL


def install(Arena arena not None, min_bytes=MIN_BYTES, cap_bytes=None):
    """A worker's hook: makes NumPy allocate arrays of at least min_bytes in arena's
    region of this process, in the calling thread's context, until uninstall().

    cap_bytes (default: half the budget): the hook never bumps the arena's
    committed bytes past it.  Raises ValueError for the parent's arena view
    (region 0: the parent uses enter(), within pool.arrays()) or a closed arena,
    RuntimeError when another NEP 49 handler is current, MemoryError when the
    bookkeeping cannot be allocated."""
    global _installed
    if arena.proc == 0:
        raise ValueError(
            "the parent's NumPy arrays go to the arena only within pool.arrays() (enter())")
    cdef Hook hook = _hook_for(arena)
    cdef hook_t *h = hook.h
    h.min_bytes = <size_t>min_bytes if min_bytes > 0 else 1
    h.cap = arena._v.budget // 2 if cap_bytes is None else <uint64_t>cap_bytes
    old = PyDataMem_SetHandler(hook.capsule)
    if old is not hook.capsule and <PyObject *>old is not h.prev_capsule:
        PyDataMem_SetHandler(old)
        raise RuntimeError("another NEP 49 memory handler is current in this context")
    h.pid = getpid()
    h.serving = True
    _installed = hook


def uninstall():
    """Gives the calling context back the handler that was current before install().
    Arrays made by the hook keep it (NumPy stores it with each array) and still
    give their blocks back when they go."""
    if _installed is not None:
        (<Hook>_installed).h.serving = False
        PyDataMem_SetHandler(<object>(<Hook>_installed).h.prev_capsule)


def enter(Arena arena not None):
    """The parent's hook (pool.arrays()): makes NumPy allocate arrays of at least
    MIN_BYTES (np.zeros too) in arena's region 0, in the calling thread's context,
    until leave(previous); returns (the Hook, which its caller keeps while it may
    enter again, and previous).  Allocations the arena cannot serve
    fall back to the handler current when the hook was made.  Raises ValueError
    for a closed arena or a worker's view, MemoryError when the bookkeeping
    cannot be allocated."""
    if arena.proc != 0:
        raise ValueError("a worker's NumPy arrays go to its arena through install()")
    cdef Hook hook = _hook_for(arena)
    cdef hook_t *h = hook.h
    h.cap = <uint64_t>(arena._v.budget * PARENT_CAP_SHARE)
    h.zero_too = True
    h.serving = True
    return hook, PyDataMem_SetHandler(hook.capsule)


def leave(previous):
    """Makes previous (what enter() returned) the calling context's handler again."""
    PyDataMem_SetHandler(previous)


def stats(Arena arena=None):
    """Hook.stats() of the worker's installed hook (arena None) or of arena's live hook
    in this process; all zero when there is none."""
    hook = _installed if arena is None else _hooks.get(arena.token)
    if hook is None:
        return dict(installed=False, live=0, served=0, fallbacks=0, min_bytes=MIN_BYTES,
                    cap_bytes=0, pid=0)
    return hook.stats()


def is_hook_array(arr, Arena arena=None):
    """True when ndarray arr owns a hook block (of arena; None: the worker's hook)."""
    cdef Py_ssize_t page = -1
    return _hook_of_array(arr, arena, &page) != NULL


def adopt(arr, Arena arena=None):
    """A Block (this process's own reference) on the hook block ndarray arr owns, or None
    when arr's data is not one (then it is copied into the arena like any array).
    arena None: the worker's installed hook; else the hook of that arena."""
    cdef Py_ssize_t page = -1
    cdef hook_t *h = _hook_of_array(arr, arena, &page)
    if h == NULL:
        return None
    return (<Arena>h.arena).ref(h.lo + <uint64_t>page * FP_ARENA_PAGE, h.recs[page].gen, False)


def rebase(arr):
    """Turns a hook array of this process into an array over a Block of the same bytes,
    in place (fastpool.transfer detaches only such arrays).  Returns False, changing
    nothing, when arr owns no hook block or its pool is shut down."""
    cdef Py_ssize_t page = -1
    cdef hook_t *h = NULL
    if _numpy_ready and PyArray_CheckExact(<PyObject *>arr):
        h = _hook_of_array(arr, <Arena>(<object>_handler_arena(arr)), &page)
    if h == NULL or not (PyArray_FLAGS(<PyArrayObject *><PyObject *>arr) & NPY_ARRAY_OWNDATA):
        return False
    if h.closed[0]:  # its pool is shut down: no Block can be taken on it any more
        return False
    if PyArray_BASE(<PyArrayObject *><PyObject *>arr) != NULL:
        return False
    cdef void *data = PyArray_DATA(<PyArrayObject *><PyObject *>arr)
    blk = (<Arena>h.arena).ref(h.lo + <uint64_t>page * FP_ARENA_PAGE, h.recs[page].gen, False)
    Py_INCREF(blk)  # PyArray_SetBaseObject steals it
    _set_base(<PyArrayObject *><PyObject *>arr, <PyObject *>blk)
    PyArray_CLEARFLAGS(<PyArrayObject *><PyObject *>arr, NPY_ARRAY_OWNDATA)
    _give_back(h, data)  # the Block's reference keeps the block from here on
    return True


cdef int _set_base(PyArrayObject *arr, PyObject *base) except -1:
    return _PyArray_SetBaseObject(arr, base)


cdef PyObject *_handler_arena(object arr):
    # The Arena of the hook that made arr (None when arr was not made by one).
    cdef PyObject *cap = PyArray_HANDLER(<PyArrayObject *><PyObject *>arr)
    if cap == NULL or not _is_hook(<object>cap):
        return <PyObject *>None
    return (<hook_t *>PyCapsule_GetPointer(<object>cap, b"mem_handler")).arena


cdef int _walk(hook_t *h, PyObject *o, int depth, set found) except -1:
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
        if _page_of(h, PyArray_DATA(<PyArrayObject *>o)) >= 0:
            found.add(<Py_ssize_t>o)  # id() of the root
        return 0
    if depth >= WALK_DEPTH:
        return 0
    if PyTuple_CheckExact(o):
        n = PyTuple_GET_SIZE(o)
        if n <= WALK_ITEMS:
            for i in range(n):
                _walk(h, PyTuple_GET_ITEM(o, i), depth + 1, found)
    elif PyList_CheckExact(o):
        n = PyList_GET_SIZE(o)
        if n <= WALK_ITEMS:
            for i in range(n):
                _walk(h, PyList_GET_ITEM(o, i), depth + 1, found)
    elif PyDict_CheckExact(o):
        n = 0
        while n < WALK_ITEMS and PyDict_Next(o, &pos, &key, &val):
            _walk(h, val, depth + 1, found)
            n += 1
    return 0


cdef object owned_roots(object result):
    """ids of the worker hook's arrays only result holds (directly, through views, or in
    tuples, lists and dicts it alone holds), or None.  The caller passes its
    only reference: serve's local, borrowed into this call.  Anything held twice
    (a global, a cache, the same array twice in the result) is left out: the
    parent must get a copy of what the worker may still change."""
    if _installed is None:
        return None
    cdef hook_t *h = (<Hook>_installed).h
    if h.live == 0 or getpid() != h.pid:
        return None
    cdef set found = set()
    _walk(h, <PyObject *>result, 0, found)
    return found or None
