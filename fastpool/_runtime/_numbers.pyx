# cython: language_level=3, boundscheck=False, wraparound=False
"""A list of plain numbers as one buffer: how a map chunk of numbers, and a chunk's
result list of them, cross the rings without a pickle opcode per item.

    parent: pack(items, start, stop) -> Numbers --pickle--> (unpack_ints, (words,)) --ring-->
    worker: pickle.loads -> unpack_ints(words) -> a tuple of the items; fn over it
    worker: pack(results) ... the same way back; the parent's loads rebuilds a tuple

The map engine packs straight from the input list (no slice of it is made), and
hands a tuple of numbers out as it is: an int, a float, a bool or a NumPy scalar
cannot be weakly referenced, so nobody can tell how long the tuple holds them.

What packs, and how it travels (each kind one unpack function, found by name on
the other side: both ends run the same fastpool):

    exact ints, each within int64       8-byte words          unpack_ints
    exact floats                        8-byte doubles        unpack_floats
    a mix of exact ints, exact floats   8-byte words and one  unpack_mixed
      and bools                         tag byte per item
    NumPy scalars all of one type       the bytes of an       unpack_numpy
      (bool, int, uint, float, complex) array of that dtype

Anything else (an int subclass such as an IntEnum, a float subclass other than a
NumPy scalar, a big int, None, a str, NumPy scalars of two types, a datetime64...)
makes ``pack`` return None and the list is pickled as before.  Either way what
arrives has the same types and values: floats bit for bit (-0.0, NaN payloads and
infinities included), a bool stays a bool, an np.float32 an np.float32.
"""

import sys

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

cdef extern from "Python.h":
    object PyTuple_New(Py_ssize_t n)
    void PyTuple_SET_ITEM(object t, Py_ssize_t i, PyObject *o)  # steals the reference
    PyObject *PyLong_FromLongLong(long long v) except NULL
    PyObject *PyFloat_FromDouble(double v) except NULL
    PyObject *PyBool_FromLong(long v) except NULL

cdef extern from "Python.h":
    long long _as_long_long "PyLong_AsLongLongAndOverflow" (PyObject *o, int *overflow) noexcept
    bint _is_int "PyLong_CheckExact" (PyObject *o) noexcept
    bint _is_float "PyFloat_CheckExact" (PyObject *o) noexcept
    bint _is_bool "PyBool_Check" (PyObject *o) noexcept  # bool cannot be subclassed
    PyObject *Py_True
    void *_type "Py_TYPE" (PyObject *o) noexcept
    PyObject **PySequence_Fast_ITEMS(object o)
    double _as_double "PyFloat_AS_DOUBLE" (PyObject *o) noexcept

# Below this many items one pickle opcode per item costs less than the global lookup.
MIN_ITEMS = 16

# unpack_mixed's tags: what each word holds
cdef enum:
    T_INT = 0
    T_FLOAT = 1
    T_BOOL = 2

# NumPy scalar type -> the one-letter code of a dtype whose arrays hand out scalars of
# exactly that type (bool, ints, uints, floats, complex); built on first use.
cdef dict _NUMPY_CODES = None


cdef class Numbers:
    """A packed list: pickles as a call of its kind's unpack function; iterating it
    unpacks it (a chunk run where it was made, without a pickle)."""

    cdef readonly bytes words
    cdef readonly str kind  # "ints", "floats", "mixed" or "numpy"
    cdef readonly object extra  # mixed: the tags; numpy: the dtype code
    cdef readonly Py_ssize_t n

    def __reduce__(self):
        if self.kind == "ints":
            return (unpack_ints, (self.words,))
        if self.kind == "floats":
            return (unpack_floats, (self.words,))
        if self.kind == "mixed":
            return (unpack_mixed, (self.words, self.extra))
        return (unpack_numpy, (self.words, self.extra))

    def __len__(self):
        return self.n

    def __iter__(self):
        fn, args = self.__reduce__()
        return iter(fn(*args))


cdef Numbers _numbers(bytes words, str kind, object extra, Py_ssize_t n):
    cdef Numbers out = Numbers.__new__(Numbers)
    out.words, out.kind, out.extra, out.n = words, kind, extra, n
    return out


cdef Py_ssize_t _pack_same(PyObject **items, Py_ssize_t n, bint floats, char *p) noexcept:
    """Writes exact floats (floats) or exact ints within int64 as 8-byte words to p,
    up to the first item of another type: returns its index (n: none), or -1 for an
    int outside int64.  The items are borrowed (the GIL is held and nothing here runs
    Python code): no reference count moves per item."""
    cdef Py_ssize_t i
    cdef PyObject *x
    cdef long long iv
    cdef int overflow
    cdef double dv
    if floats:
        for i in range(n):
            x = items[i]
            if not _is_float(x):
                return i
            dv = _as_double(x)
            memcpy(p + 8 * i, &dv, 8)
        return n
    for i in range(n):
        x = items[i]
        if not _is_int(x):
            return i
        iv = _as_long_long(x, &overflow)  # an exact int: no error is possible
        if overflow:
            return -1
        memcpy(p + 8 * i, &iv, 8)
    return n


cdef int _pack_mixed(PyObject **items, Py_ssize_t n, char *p, char *tags) noexcept:
    """Exact ints within int64, exact floats and bools as words and tags; -1 at the
    first item that is none of them."""
    cdef Py_ssize_t i
    cdef PyObject *x
    cdef long long iv
    cdef int overflow
    cdef double dv
    for i in range(n):
        x = items[i]
        if _is_int(x):
            iv = _as_long_long(x, &overflow)
            if overflow:
                return -1
            tags[i] = T_INT
        elif _is_float(x):
            dv = _as_double(x)
            memcpy(&iv, &dv, 8)
            tags[i] = T_FLOAT
        elif _is_bool(x):
            iv = x == Py_True
            tags[i] = T_BOOL
        else:
            return -1
        memcpy(p + 8 * i, &iv, 8)
    return 0


cdef object _numpy_code(object t):
    """The dtype code of NumPy scalar type t, or None (not one, or not one we pack)."""
    global _NUMPY_CODES
    np = sys.modules.get("numpy")
    if np is None:  # without NumPy imported no item can be a NumPy scalar
        return None
    if _NUMPY_CODES is None:
        codes = {}
        for code in "?bBhHiIlLqQefdgFDG":
            # an array of dtype code hands out scalars of exactly this type
            codes.setdefault(np.dtype(code).type, code)
        _NUMPY_CODES = codes
    return _NUMPY_CODES.get(t)


cdef object _pack_numpy(list items, Py_ssize_t start, Py_ssize_t n):
    ft = type(items[start])
    code = _numpy_code(ft)
    if code is None:
        return None
    # _numpy_code ran Python code: another thread may have changed the list meanwhile
    if len(items) < start + n:
        return None
    cdef PyObject **xs = <PyObject **>PySequence_Fast_ITEMS(items) + start
    cdef void *t = <void *>ft
    cdef Py_ssize_t i
    for i in range(n):
        if _type(xs[i]) != t:  # one type, so the array's dtype is each item's own
            return None
    arr = sys.modules["numpy"].array(items[start:start + n], dtype=code)
    return _numbers(arr.tobytes(), "numpy", code, n)


def pack(list items, Py_ssize_t start=0, Py_ssize_t stop=-1):
    """``items[start:stop]`` (stop -1: to the end) as a Numbers, or None when it is
    not made of what packs (see the module docstring) or is shorter than MIN_ITEMS."""
    cdef Py_ssize_t size = len(items), n, k
    if stop < 0 or stop > size:
        stop = size
    if start < 0:
        start = 0
    n = stop - start
    if n < MIN_ITEMS:
        return None
    # xs is the list's own item array: valid while no Python code runs (none does
    # below: the checks and conversions are of exact ints, floats and bools)
    cdef PyObject **xs = <PyObject **>PySequence_Fast_ITEMS(items) + start
    cdef bint floats = _is_float(xs[0])
    if not floats and not _is_int(xs[0]):
        if _is_bool(xs[0]):
            k = 0
        else:
            return _pack_numpy(items, start, n)
    words = PyBytes_FromStringAndSize(NULL, n * 8)  # a new bytes object may be written
    cdef char *p = PyBytes_AS_STRING(words)
    if floats or _is_int(xs[0]):
        k = _pack_same(xs, n, floats, p)
        if k < 0:
            return None
        if k == n:
            return _numbers(words, "floats" if floats else "ints", None, n)
    # a mix from item k on: the items before it are all ints or all floats
    tags = PyBytes_FromStringAndSize(NULL, n)
    cdef char *tp = PyBytes_AS_STRING(tags)
    memset(tp, T_FLOAT if floats else T_INT, k)
    if _pack_mixed(xs + k, n - k, p + 8 * k, tp + k) < 0:
        return None
    return _numbers(words, "mixed", tags, n)


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


def unpack_mixed(bytes words, bytes tags):
    """The tuple of ints, floats and bools packed in ``words``, ``tags`` saying which
    each is.  Raises ValueError when the two do not agree (a damaged payload)."""
    cdef const char *p = PyBytes_AS_STRING(words)
    cdef const char *tp = PyBytes_AS_STRING(tags)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(tags)
    cdef int64_t v
    cdef double d
    cdef char tag
    if PyBytes_GET_SIZE(words) != 8 * n:
        raise ValueError(f"packed numbers: {PyBytes_GET_SIZE(words)} bytes for {n} tags")
    out = PyTuple_New(n)
    for i in range(n):  # a tuple's empty slots are NULL: a raise below leaves it sound
        tag = tp[i]
        memcpy(&v, p + 8 * i, 8)
        if tag == T_INT:
            PyTuple_SET_ITEM(out, i, PyLong_FromLongLong(v))
        elif tag == T_FLOAT:
            memcpy(&d, &v, 8)
            PyTuple_SET_ITEM(out, i, PyFloat_FromDouble(d))
        elif tag == T_BOOL:
            PyTuple_SET_ITEM(out, i, PyBool_FromLong(v != 0))
        else:
            raise ValueError(f"packed numbers: unknown tag {tag} at item {i}")
    return out


def unpack_numpy(bytes data, str code):
    """The tuple of NumPy scalars of dtype ``code`` packed in ``data``."""
    import numpy

    return tuple(numpy.frombuffer(data, dtype=code))
