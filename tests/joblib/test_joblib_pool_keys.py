"""The backend's pools are keyed exactly: options equal to the code that receives them share
one pool, and options that differ in any way that code can see never do."""

from __future__ import annotations

import _joblib_tasks as T
import numpy as np
from joblib import Parallel, delayed, parallel_config

from fastpool._integrations._joblib_pools import _frozen


def initialised(initargs: tuple) -> list:
    """What each task of a Parallel call finds set by the pool's initializer."""
    with parallel_config(backend="fastpool", n_jobs=2, initializer=T.set_offset, initargs=initargs):
        return Parallel()(delayed(T.offset)(i) for i in range(2))


def test_structured_arrays_with_other_fields_get_their_own_pool():
    # the same 8 bytes under other field names: dtype.str is '|V8' for both
    xy = np.zeros(3, dtype=[("x", "<i4"), ("y", "<i4")])
    ab = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")])
    assert xy.tobytes() == ab.tobytes() and xy.dtype.str == ab.dtype.str
    assert [a.dtype.names for a in initialised((xy,))] == [("x", "y")] * 2
    assert [a.dtype.names for a in initialised((ab,))] == [("a", "b")] * 2


def test_an_object_with_an_array_interface_but_no_dtype_is_kept_by_identity():
    # a PIL Image in initargs raised AttributeError: 'Image' object has no attribute 'dtype'
    thing = T.LooksLikeAnArray(b"\x01\x02")
    assert [t.data for t in initialised((thing,))] == [b"\x01\x02"] * 2
    assert _frozen(thing) == _frozen(thing) != _frozen(T.LooksLikeAnArray(b"\x01\x02"))


def test_values_python_calls_equal_but_the_receiver_tells_apart_are_keyed_apart():
    apart = [
        (1, 1.0, True, np.int64(1), np.float32(1)),
        (0.0, -0.0),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # an initializer may iterate it
        ([1, 2], (1, 2)),
        (np.zeros(2, "<i4"), np.zeros(2, ">i4"), np.zeros((1, 2), "<i4"), np.zeros(2, "<u4")),
        (np.ma.array([1, 2], mask=[0, 1]), np.ma.array([1, 2], mask=[1, 0])),
    ]
    for values in apart:
        keys = [_frozen(v) for v in values]
        assert len(set(keys)) == len(values), values


def test_equal_values_built_afresh_share_a_key():
    def build() -> tuple:
        a = np.zeros(6, dtype=[("x", "<i4"), ("y", "u1")]).reshape(2, 3)
        return ([1, 2.5, "s"], {"k": (a, a.T[::-1])}, {3, 4}, np.float32(2), None, a)

    assert _frozen(build()) == _frozen(build())
    assert hash(_frozen(build())) == hash(_frozen(build()))
