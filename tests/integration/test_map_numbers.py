"""A map chunk of numbers travels as one buffer (``_runtime/_numbers``), both ways,
and nothing about the items changes: an int stays an int, a float stays a float bit
for bit, a bool stays a bool, an np.float32 an np.float32; big ints, subclasses and
NumPy scalars of several types are pickled as before.  Each test names what a
careless fast path would break."""

from __future__ import annotations

import enum
import math
import pickle
import struct
from typing import Any

import _tasks
import numpy as np
import pytest

import fastpool
from fastpool._runtime import _call, _codec, _mapper, _numbers

N = 300  # several chunks of more than _numbers.MIN_ITEMS items at chunksize=100


class Level(enum.IntEnum):  # an int subclass: must arrive as itself
    LOW = 1
    HIGH = 2


class Celsius(float):  # a float subclass that is not a NumPy scalar: must arrive as itself
    pass


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


NAN_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]


CASES: dict[str, list[Any]] = {
    "ints": [i * 7919 - 10**6 for i in range(N)] + [2**63 - 1, -(2**63)],
    "floats": [i * 0.37 - 50.0 for i in range(N)] + [-0.0, math.inf, -math.inf, math.nan],
    "bools": [i % 3 == 0 for i in range(N)],
    "ints_then_a_bool": list(range(N)) + [True],
    "ints_then_a_float": list(range(N)) + [1.0],
    "floats_then_an_int": [float(i) for i in range(N)] + [1],
    "ints_then_a_big_int": list(range(N)) + [2**63],
    "ints_then_a_negative_big_int": list(range(N)) + [-(2**63) - 1],
    "int_subclass": [Level.LOW, Level.HIGH] * (N // 2),
    "ints_then_none": list(range(N)) + [None],
    "ints_floats_bools": [[i, i * 0.5, i % 2 == 0][i % 3] for i in range(N)]
    + [-0.0, math.nan, NAN_PAYLOAD, 2**63 - 1, -(2**63), True, False],
    "mixed_then_a_big_int": [1, 1.5, True] * (N // 3) + [2**63],
    "mixed_then_a_subclass": [1, 1.5, True] * (N // 3) + [Level.LOW],
    "floats_then_a_float_subclass": [float(i) for i in range(N)] + [Celsius(1.0)],
    "float_subclass": [Celsius(i) for i in range(N)],
    "numpy_float64": [np.float64(i * 0.37) for i in range(N)]
    + [np.float64(-0.0), np.float64(np.nan), np.float64(NAN_PAYLOAD), np.float64(np.inf)],
    "numpy_float32": [np.float32(i * 0.37) for i in range(N)] + [np.float32(np.nan)],
    "numpy_int64": [np.int64(i * 7919 - 10**6) for i in range(N)],
    "numpy_uint8": [np.uint8(i % 256) for i in range(N)],
    "numpy_bool": [np.bool_(i % 3 == 0) for i in range(N)],
    "numpy_complex128": [np.complex128(i, -i) for i in range(N)],
    "floats_then_a_numpy_float64": [float(i) for i in range(N)] + [np.float64(1.0)],
    "numpy_float64_then_a_float32": [np.float64(i) for i in range(N)] + [np.float32(1.0)],
    "numpy_datetime64": [np.datetime64(i, "s") for i in range(N)],
}
PACKED = {
    "ints": "ints",
    "floats": "floats",
    "bools": "mixed",
    "ints_then_a_bool": "mixed",
    "ints_then_a_float": "mixed",
    "floats_then_an_int": "mixed",
    "ints_floats_bools": "mixed",
    "numpy_float64": "numpy",
    "numpy_float32": "numpy",
    "numpy_int64": "numpy",
    "numpy_uint8": "numpy",
    "numpy_bool": "numpy",
    "numpy_complex128": "numpy",
}


def _same(got: list, want: list) -> None:
    assert [type(x) for x in got] == [type(x) for x in want]
    for g, w in zip(got, want):
        if isinstance(w, np.generic):
            assert g.tobytes() == w.tobytes()  # bit for bit, NaN payloads too
        elif type(w) is float:
            assert _bits(g) == _bits(w)  # -0.0 and NaN too
        else:
            assert g == w
    assert len(got) == len(want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_items_reach_the_worker_and_come_back_with_their_types(
    pool: fastpool.Pool, name: str
) -> None:
    items = CASES[name]
    _same(list(pool.map(_tasks.identity, items, chunksize=100)), items)
    names = list(pool.map(_tasks.type_name, items, chunksize=100))
    assert names == [type(x).__name__ for x in items]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_default_chunk_size_keeps_the_types(pool: fastpool.Pool, name: str) -> None:
    items = CASES[name]
    _same(list(pool.map(_tasks.identity, items)), items)


@pytest.mark.parametrize(
    ("fn", "items"),
    [
        (float, list(range(N))),  # ints in, floats out
        (int, [i + 0.5 for i in range(N)]),  # floats in, ints out
        (bool, list(range(N))),  # ints in, bools out: not packed as ints
        (_tasks.type_name, list(range(N))),  # ints in, strs out
    ],
)
def test_results_of_another_type_keep_their_type(pool: fastpool.Pool, fn: Any, items: list) -> None:
    _same(list(pool.map(fn, items, chunksize=100)), [fn(x) for x in items])


def test_an_item_that_raises_keeps_the_packed_results_before_it(pool: fastpool.Pool) -> None:
    it = pool.map(_tasks.fail_at, range(N), [150] * N, chunksize=100)
    got = []
    with pytest.raises(ValueError, match="item 150 is bad"):
        for x in it:
            got.append(x)
    _same(got, [x * 2 for x in range(150)])


def test_a_list_of_numbers_is_packed_and_nothing_else_is() -> None:
    for name, items in CASES.items():
        packed = _numbers.pack(items)
        if name in PACKED:
            assert packed is not None and packed.kind == PACKED[name], name
            assert len(packed) == len(items)
            _same(pickle.loads(pickle.dumps(packed)), items)
            _same(list(packed), items)  # iterated where it was made (an inline run)
        else:
            assert packed is None, name
    assert _numbers.pack([1] * (_numbers.MIN_ITEMS - 1)) is None
    assert _numbers.pack([]) is None


def test_a_chunk_and_its_results_travel_as_one_buffer() -> None:
    ints, floats = CASES["ints"], CASES["floats"]
    call = _codec.encode_args(ints, (ints,), {})
    assert b"unpack_ints" in call and len(call) < 8 * len(ints) + 200
    _same(pickle.loads(call), ints)
    result, handed = _codec.encode_result(_call.run_chunk(_tasks.identity, floats, False))
    assert handed is None and b"unpack_floats" in result and len(result) < 8 * len(floats) + 200
    _same(pickle.loads(result), floats)
    mixed = CASES["ints_floats_bools"]
    call = _codec.encode_args(mixed, (mixed,), {})
    assert b"unpack_mixed" in call and len(call) < 9 * len(mixed) + 200
    _same(pickle.loads(call), mixed)
    scalars = CASES["numpy_float64"]  # a NumPy scalar pickles as ~100 bytes on its own
    result, handed = _codec.encode_result(_call.run_chunk(_tasks.identity, scalars, False))
    assert handed is None and b"unpack_numpy" in result and len(result) < 8 * len(scalars) + 200
    _same(pickle.loads(result), scalars)
    # a list that cannot be packed is pickled as it is
    none = CASES["ints_then_none"]
    assert b"unpack" not in _codec.encode_args(none, (none,), {})


def test_damaged_tags_are_an_error_not_a_wrong_value() -> None:
    packed = _numbers.pack(CASES["ints_floats_bools"])
    assert packed is not None
    with pytest.raises(ValueError, match="unknown tag 7"):
        _numbers.unpack_mixed(packed.words, b"\x07" + packed.extra[1:])
    with pytest.raises(ValueError, match="bytes for"):
        _numbers.unpack_mixed(packed.words[:-8], packed.extra)


def test_a_list_input_is_packed_per_chunk_without_slicing_and_falls_back_per_chunk() -> None:
    items = list(range(40)) + [None] + list(range(40))
    chunks = _mapper.Chunks((items,), 20, _mapper.Sizing(2))
    got = []
    while (chunk := chunks.next()) is not None:
        got.append(chunk)
    assert [type(c).__name__ for c in got] == ["Numbers", "Numbers", "list", "list", "list"]
    _same([x for c in got for x in c], items)
    # a float among the ints packs its chunk as a mix, and the engine keeps packing
    items = list(range(40)) + [1.5] + list(range(39))
    chunks = _mapper.Chunks((items,), 20, _mapper.Sizing(2))
    got = []
    while (chunk := chunks.next()) is not None:
        got.append(chunk)
    assert [c.kind for c in got] == ["ints", "ints", "mixed", "ints"]
    _same([x for c in got for x in c], items)


def test_packed_results_are_handed_out_as_they_are() -> None:
    results = pickle.loads(
        _codec.encode_result(_call.run_chunk(_tasks.identity, range(N), False))[0]
    )
    assert type(results) is tuple  # a tuple is handed out without popping each item
    _same(list(_mapper.hand_out(results)), list(range(N)))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "uint16", "bool", "complex64"])
def test_a_map_over_an_ndarray_gives_back_its_own_scalars(pool: fastpool.Pool, dtype: str) -> None:
    arr = (np.arange(N) % 7).astype(dtype)
    _same(list(pool.map(_tasks.identity, arr, chunksize=100)), list(arr))
    assert set(pool.map(_tasks.type_name, arr, chunksize=100)) == {arr.dtype.type.__name__}


@pytest.mark.parametrize("name", ["ints", "floats", "ints_floats_bools", "numpy_float64"])
def test_a_task_that_returns_a_list_of_numbers_gets_a_list(pool: fastpool.Pool, name: str) -> None:
    # only a map chunk's results are packed (and handed out from a tuple)
    items = CASES[name]
    got = pool.submit(_tasks.identity, items).result()
    assert type(got) is list
    _same(got, items)
    result, handed = _codec.encode_result(items)
    assert b"unpack" not in result and type(pickle.loads(result)) is list
