# cython: language_level=3, boundscheck=False, wraparound=False
"""A list of plain numbers as one buffer: how a map chunk of ints or floats, and a
chunk's result list of them, cross the rings without a pickle opcode per item.

    parent: pack(items, start, stop) -> Numbers --pickle--> (unpack_ints, (words,)) --ring-->
    worker: pickle.loads -> unpack_ints(words) -> a tuple of the items; fn over it
    worker: pack(results) ... the same way back; the parent's loads rebuilds a tuple

The map engine packs straight from the input list (no slice of it is made), and
hands a tuple of numbers out as it is: an int or a float cannot be weakly
referenced, so nobody can tell how long the tuple holds them.

Only a list whose every item is exactly ``int`` (each within int64) or exactly
``float`` is packed: a bool, an int subclass, a big int, a mix of ints and
floats or anything else makes ``pack`` return None and the list is pickled as
before, so what arrives has the same types and values (floats bit for bit:
-0.0, NaN payloads and infinities included).  Both ends run the same fastpool,
so the unpack functions are found by name on the other side.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t
from libc.string cimport memcpy
from cpython.ref cimport PyObject

cdef extern from "Python.h":
    object PyTuple_New(Py_ssize_t n)
    void PyTuple_SET_ITEM(object t, Py_ssize_t i, PyObject *o)  # steals the reference
    PyObject *PyLong_FromLongLong(long long v) except NULL
    PyObject *PyFloat_FromDouble(double v) except NULL

cdef extern from "Python.h":
    bint PyLong_CheckExact(object o)
    bint PyFloat_CheckExact(object o)
    long long _as_long_long "PyLong_AsLongLongAndOverflow" (PyObject *o, int *overflow) noexcept
    bint _is_int "PyLong_CheckExact" (PyObject *o) noexcept
    bint _is_float "PyFloat_CheckExact" (PyObject *o) noexcept
    PyObject **PySequence_Fast_ITEMS(object o)
    double _as_double "PyFloat_AS_DOUBLE" (PyObject *o) noexcept

cdef int _pack_into(PyObject **items, Py_ssize_t n, bint floats, char *p) noexcept:
    """Writes n exact floats (floats) or exact ints within int64 as 8-byte words to p;
    -1 at the first item that is not one.  The items are borrowed (the GIL is held
    and nothing here runs Python code): no reference count moves per item."""
    cdef Py_ssize_t i
    cdef PyObject *x
    cdef long long iv
    cdef int overflow
    cdef double dv
    if floats:
        for i in range(n):
            x = items[i]
            if not _is_float(x):
                return -1
            dv = _as_double(x)
            memcpy(p + 8 * i, &dv, 8)
        return 0
    for i in range(n):
        x = items[i]
        if not _is_int(x):
            return -1
        iv = _as_long_long(x, &overflow)  # an exact int: no error is possible
        if overflow:
            return -1
        memcpy(p + 8 * i, &iv, 8)
    return 0


# Below this many items one pickle opcode per item costs less than the global lookup.
MIN_ITEMS = 16


cdef class Numbers:
    """A packed list: pickles as a call of ``unpack_ints`` or ``unpack_floats`` on its
    words; iterating it unpacks it (a chunk run where it was made, without a pickle)."""

    cdef readonly bytes words
    cdef readonly bint floats

    def __reduce__(self):
        return (unpack_floats if self.floats else unpack_ints, (self.words,))

    def __len__(self):
        return PyBytes_GET_SIZE(self.words) // 8

    def __iter__(self):
        return iter(unpack_floats(self.words) if self.floats else unpack_ints(self.words))


def pack(list items, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """``items[start:stop]`` (stop -1: to the end) as a Numbers, or None when it is not
    all exact ints (in int64) or all exact floats, or is shorter than MIN_ITEMS."""
    cdef Py_ssize_t size = len(items), n
    if stop < 0 or stop > size:
        stop = size
    if start < 0:
        start = 0
    n = stop - start
    if n < MIN_ITEMS:
        return None
    first = items[start]
    cdef bint floats = PyFloat_CheckExact(first)
    if not floats and not PyLong_CheckExact(first):
        return None
    words = PyBytes_FromStringAndSize(NULL, n * 8)  # a new bytes object may be written
    if _pack_into(<PyObject **>PySequence_Fast_ITEMS(items) + start, n, floats,
                  PyBytes_AS_STRING(words)) < 0:
        return None
    cdef Numbers out = Numbers.__new__(Numbers)
    out.words = words
    out.floats = floats
    return out


def unpack_ints(bytes words):
    """The tuple of ints packed in ``words`` (8-byte signed words, native order)."""
    cdef const char *p = PyBytes_AS_STRING(words)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(words) // 8
    cdef int64_t v
    out = PyTuple_New(n)
    for i in range(n):
        memcpy(&v, p + 8 * i, 8)
        PyTuple_SET_ITEM(out, i, PyLong_FromLongLong(v))
    return out


def unpack_floats(bytes words):
    """The tuple of floats packed in ``words`` (8-byte doubles, native order)."""
    cdef const char *p = PyBytes_AS_STRING(words)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(words) // 8
    cdef double v
    out = PyTuple_New(n)
    for i in range(n):
        memcpy(&v, p + 8 * i, 8)
        PyTuple_SET_ITEM(out, i, PyFloat_FromDouble(v))
    return out
