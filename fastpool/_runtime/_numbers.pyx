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
    double PyFloat_AS_DOUBLE(object o)

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
    cdef Py_ssize_t size = len(items), i, n
    if stop < 0 or stop > size:
        stop = size
    if start < 0:
        start = 0
    n = stop - start
    cdef int64_t iv
    cdef double dv
    cdef char *p
    if n < MIN_ITEMS:
        return None
    first = items[start]
    cdef bint floats = PyFloat_CheckExact(first)
    if not floats and not PyLong_CheckExact(first):
        return None
    words = PyBytes_FromStringAndSize(NULL, n * 8)  # a new bytes object may be written
    p = PyBytes_AS_STRING(words)
    if floats:
        for i in range(n):
            x = items[start + i]
            if not PyFloat_CheckExact(x):
                return None
            dv = PyFloat_AS_DOUBLE(x)
            memcpy(p + 8 * i, &dv, 8)
    else:
        for i in range(n):
            x = items[start + i]
            if not PyLong_CheckExact(x):
                return None
            try:
                iv = x  # Cython's conversion reads a small int's digit directly
            except OverflowError:
                return None
            memcpy(p + 8 * i, &iv, 8)
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
