# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""NumPy arrays over arena blocks: the one module that knows an ndarray's C layout.

    pool.empty / zeros      new_array(arena, shape, dtype) -> ndarray over a fresh Block
    pool.share, a plain     copy_in(arena, src) -> the one copy into a fresh Block,
    array sent by value       page-matched to src (see PAGE_MATCH_MIN_BYTES)
    the array pickler       address_of(arr): where its data starts, for the descriptor
    fastpool.transfer       detach(arr, DetachedArray): the memory taken from the handle

The arena (_arena.pyx) answers for blocks, references and regions and never
touches NumPy; this module makes and unmakes the arrays that view them.  Every
array made here has a Block as its base, so the block lives while any view does.
"""

from libc.stdint cimport uint64_t
from cpython.ref cimport PyObject

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

from fastpool._native._arena cimport FP_ARENA_PAGE, Arena

# Detaching an ndarray in place (fastpool.transfer): NumPy has no API to take
# the memory away from an array object, so this writes its fields: every
# dimension becomes 0, data points at a static zeroed buffer, WRITEABLE is
# cleared, and the object's type becomes DetachedArray, whose methods raise.
# Any path DetachedArray does not cover sees a zero-length read-only array.
# The base (the Block, hence this process's reference) stays until the object
# goes: a memoryview or np.frombuffer taken from it before the transfer holds
# the object, not the Block, and still points at the block's bytes; dropping
# the Block here let the block be reused (or unmapped) under those views
#.
cdef extern from *:
    """
    #include <numpy/ndarraytypes.h>
    static char fp_detached_data[256] __attribute__((aligned(64)));
    static int fp_detach_array(PyObject *arr, PyObject *newtype)
    {
        PyArrayObject_fields *f = (PyArrayObject_fields *)arr;
        PyTypeObject *old_type = Py_TYPE(arr);
        if (f->nd < 1 || (f->flags & NPY_ARRAY_OWNDATA))
            return -1;
        for (int i = 0; i < f->nd; i++)
            f->dimensions[i] = 0;
        f->data = fp_detached_data;
        f->flags &= ~NPY_ARRAY_WRITEABLE;
        PyTypeObject *nt = (PyTypeObject *)newtype;
        if (nt->tp_basicsize == old_type->tp_basicsize &&
            (nt->tp_flags & Py_TPFLAGS_HAVE_GC) == (old_type->tp_flags & Py_TPFLAGS_HAVE_GC)) {
            Py_INCREF(newtype);
            Py_SET_TYPE(arr, (PyTypeObject *)newtype);
            if (old_type->tp_flags & Py_TPFLAGS_HEAPTYPE)
                Py_DECREF(old_type);
        }
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

cdef extern from *:
    """
    static size_t fp_array_address(PyObject *arr)
    {
        return (size_t)((PyArrayObject_fields *)arr)->data;
    }
    """
    size_t fp_array_address(object arr)

# A copy this large into a block starts at the source's offset within its page.
# glibc's memmove for copies past its non-temporal threshold runs 3-4x slower
# when the destination sits a little above the source modulo 4 KiB (4K
# aliasing: 66 ms instead of 17 ms for 256 MiB on this machine, dst - src = 48),
# and a block's data starts 64 bytes into a page while a large malloc'd array
# starts 16 bytes in.  The descriptor's byte offset carries the padding.
PAGE_MATCH_MIN_BYTES = 1 << 20


def plain_instances(newtype):
    """Makes newtype's instances GC-free like ndarray's (see fp_plain_instances)."""
    fp_plain_instances(newtype)


def detach(arr, newtype):
    """Takes the memory away from ndarray arr in place (see fp_detach_array)."""
    if fp_detach_array(arr, newtype) != 0:
        raise TypeError(
            "only views of shared memory with at least one dimension can be transferred")


def new_array(Arena arena, shape, dtype, order="C", bint zero=False):
    """An ndarray over a fresh block of arena (pool.empty / pool.zeros)."""
    return _new_array(arena, shape, dtype, order, zero, -1)


cdef object _new_array(Arena arena, shape, dtype, order, bint zero, Py_ssize_t page_of):
    # page_of >= 0: the data starts at that offset within a page (see PAGE_MATCH_MIN_BYTES)
    import numpy
    dt = numpy.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot live in shared memory; "
                        "use a numeric or structured dtype without object fields")
    if order not in ("C", "F"):
        raise ValueError("order must be 'C' or 'F'")
    import operator
    try:  # indexes only, as numpy.empty takes them: 2.5 or "10" is an error, not a shape
        shp = (operator.index(shape),) if not isinstance(shape, (tuple, list)) else tuple(
            operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a tuple of ints, not {shape!r}") from None
    if any(s < 0 for s in shp):
        raise ValueError(f"negative dimensions are not allowed: {shp}")
    # Python ints do not wrap; the bound is what a buffer (Py_ssize_t) can span.
    # A size past the arena's budget is SharedMemoryError from alloc, saying so.
    n = dt.itemsize
    for s in shp:
        n *= s
    if n > PY_SSIZE_T_MAX:
        raise ValueError(f"an array of shape {shp} and dtype {dt} would take {n} bytes, more than "
                         "a process can address")
    pad = 0
    if page_of >= 0 and n >= PAGE_MATCH_MIN_BYTES:
        # cdivision: C's % keeps the sign, so stay non-negative before it
        pad = (page_of + FP_ARENA_PAGE - arena._v.hdr % FP_ARENA_PAGE) % FP_ARENA_PAGE
    blk = arena.alloc(n + pad)
    arr = numpy.ndarray(shp, dt, buffer=blk, offset=pad, order=order)
    if zero and n and not blk.fresh:
        # a reused block holds old bytes; a fresh one is the kernel's zero pages
        # (a 256 MiB memset would cost what the pages' first fault already did)
        numpy.frombuffer(blk, numpy.uint8, n + pad)[:] = 0
    return arr


def address_of(arr):
    """Where ndarray arr's data starts (its __array_interface__ address, without the dict).

    Raises TypeError for anything that is not an ndarray."""
    import numpy
    if not isinstance(arr, numpy.ndarray):
        raise TypeError(f"an ndarray is needed, not {type(arr).__name__}")
    return fp_array_address(arr)


def copy_in(Arena arena, src):
    """A copy of ndarray src in a fresh block of arena, C order unless src is only
    F-contiguous, starting at src's offset within its page when that keeps src's
    alignment (see PAGE_MATCH_MIN_BYTES).  Raises what alloc raises."""
    import numpy
    order = "F" if src.flags.f_contiguous and not src.flags.c_contiguous else "C"
    cdef size_t addr = fp_array_address(src)
    page_of = <Py_ssize_t>(addr % FP_ARENA_PAGE) if addr % src.dtype.alignment == 0 else -1
    out = _new_array(arena, src.shape, src.dtype, order, False, page_of)
    numpy.copyto(out, src, casting="no")
    return out


def share(Arena arena, arr, bint readonly=False):
    """A copy of arr in arena (pool.share): the one copy in, then descriptors only."""
    import numpy
    out = copy_in(arena, numpy.asarray(arr))
    if readonly:
        out.flags.writeable = False
    return out
