"""The map engine's promises that ``Executor.map`` makes too (issue 15, section 6):
a timeout cancels what it stops waiting for, a yielded result lives only as long
as the caller keeps it, and ``buffersize`` (Python 3.14) bounds the look-ahead."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import weakref
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Any, Callable, Iterator

import _tasks
import numpy as np
import pytest
from _waiting import wait_for

import fastpool
from fastpool._runtime import _mapper


def _busy(pool: fastpool.Pool) -> int:
    return sum(bool(w["current_task"]) for w in pool.stats()["workers"])


def test_a_map_timeout_cancels_the_chunk_it_waited_for_and_those_not_started(
    tmp_path: Path,
) -> None:
    gate, ran = str(tmp_path / "gate"), [str(tmp_path / f"ran-{i}") for i in range(3)]
    with fastpool.Pool(1) as pool:
        blocker = pool.submit(_tasks.gate, gate)
        wait_for(lambda: _busy(pool) == 1, what="the blocker to run")
        it = pool.map(_tasks.touch_then_sleep, ran, range(3), [0] * 3, chunksize=1, timeout=0.2)
        with pytest.raises(FuturesTimeout):
            next(it)  # the first chunk waits behind the blocker
        open(gate, "w").close()
        assert blocker.result(timeout=30)[0] is None
        pool.drain()  # anything still queued or prefetched would run now
    assert [p for p in ran if os.path.exists(p)] == []


def _watched(results: Iterator[Any]) -> list[bool]:
    """For each result: was it freed once the caller dropped it?"""
    freed = []
    for obj in results:
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        freed.append(ref() is None)
    return freed


@pytest.mark.parametrize("chunksize", [1, 5])
@pytest.mark.parametrize(
    "how",
    [
        lambda pool, cs: pool.map(_tasks.make_dummy, range(10), chunksize=cs),
        lambda pool, cs: pool.map(_tasks.make_dummy, range(10), chunksize=cs, progress=print),
        lambda pool, cs: pool.imap_unordered(_tasks.make_dummy, range(10), chunksize=cs),
    ],
    ids=["map", "map-progress", "imap_unordered"],
)
def test_a_yielded_result_dies_once_the_caller_drops_it(
    pool: fastpool.Pool, how: Callable[..., Iterator[Any]], chunksize: int
) -> None:
    assert _watched(how(pool, chunksize)) == [True] * 10


def test_an_amap_result_dies_once_the_caller_drops_it(pool: fastpool.Pool) -> None:
    async def main() -> list[bool]:
        freed = []
        async for obj in pool.amap(_tasks.make_dummy, range(10), chunksize=5):
            ref = weakref.ref(obj)
            del obj
            gc.collect()
            freed.append(ref() is None)
        return freed

    assert asyncio.run(main()) == [True] * 10


@pytest.mark.parametrize("bad", ["2", 2.0, [2]])
def test_a_buffersize_that_is_not_an_int_is_a_type_error(pool: fastpool.Pool, bad: Any) -> None:
    with pytest.raises(TypeError, match="buffersize must be"):
        pool.map(_tasks.double, range(4), buffersize=bad)
    with pytest.raises(TypeError, match="buffersize must be"):
        pool.imap_unordered(_tasks.double, range(4), buffersize=bad)


@pytest.mark.parametrize("bad", [0, -1])
def test_a_buffersize_below_one_is_a_value_error(pool: fastpool.Pool, bad: int) -> None:
    with pytest.raises(ValueError, match="buffersize"):
        pool.map(_tasks.double, range(4), buffersize=bad)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("buffersize", [1, 3])
def test_buffersize_bounds_the_chunks_submitted_ahead_of_the_consumer(
    pool: fastpool.Pool, buffersize: int, ordered: bool
) -> None:
    pulled = itertools.count()
    taken = [0]

    def items() -> Iterator[int]:
        for i in itertools.count():  # endless: only the bound stops the reading
            taken[0] = next(pulled) + 1
            yield i

    chunk = 4
    mapping = (
        pool.map(_tasks.double, items(), chunksize=chunk, buffersize=buffersize)
        if ordered
        else pool.imap_unordered(_tasks.double, items(), chunk, buffersize=buffersize)
    )
    got = []
    for i, r in enumerate(mapping):
        # submitted and not yet handed out: at most buffersize chunks (and the
        # rest of the chunk being handed out now)
        assert taken[0] - i <= (buffersize + 1) * chunk
        got.append(r)
        if len(got) == 200:
            break
    mapping.close()  # type: ignore[attr-defined]
    if ordered:
        assert got == [2 * i for i in range(200)]
    else:
        assert len(set(got)) == 200


def test_a_map_of_numbers_submits_enough_of_them_ahead(pool: fastpool.Pool) -> None:
    # With a few chunks in flight, a worker whose chunks are done waits for the consumer
    # to take the head chunk from the other worker; on 2 cores shared by 2 workers and
    # the parent that idles a core (docs/benchmarks.md: map over 200,000 small items).
    # Packed numbers are 8 bytes each: 100,000 in flight hold under 1 MiB.
    mapping = pool.map(_tasks.double, list(range(400_000)), chunksize=5000)
    assert pool.stats()["chunks_submitted"] * 5000 >= 100_000  # at call time
    assert next(mapping) == 0
    mapping.close()  # type: ignore[attr-defined]


def test_a_map_of_other_items_keeps_its_window_in_items(pool: fastpool.Pool) -> None:
    # Items of unknown size (here strings, pickled one by one) keep the smaller window:
    # what a map holds in flight stays bounded whatever each item weighs.
    items = ["x" * 100] * 400_000
    mapping = pool.map(len, items, chunksize=5000)
    assert pool.stats()["chunks_submitted"] == _mapper.window(pool.workers, 5000)
    assert _mapper.window(pool.workers, 5000) * 5000 <= _mapper.WINDOW_ITEMS
    assert next(mapping) == 100
    mapping.close()  # type: ignore[attr-defined]


def test_a_map_of_large_arrays_keeps_its_window_in_bytes(
    pool: fastpool.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each array sent by value is copied into the arena at submit: a window of 128
    # chunks of 64 MiB slices copied a whole 2 GiB batch at once (issue 24).  Here the
    # cap is 4 MiB and each array 1 MiB: at most 4 chunks ahead, and never fewer than
    # one per worker and a spare.
    monkeypatch.setattr(_mapper, "WINDOW_BYTES", 4 << 20)
    arrays = [np.full(1 << 17, float(i)) for i in range(32)]  # 1 MiB each
    mapping = pool.map(_tasks.identity, arrays, chunksize=1)
    assert pool.stats()["chunks_submitted"] == 4  # at call time
    got = [float(r[0]) for r in mapping]
    assert got == [float(i) for i in range(32)]
    assert pool.stats()["chunks_submitted"] == 32
    monkeypatch.setattr(_mapper, "WINDOW_BYTES", 1)
    mapping = pool.map(_tasks.identity, arrays, chunksize=1)
    assert pool.stats()["chunks_submitted"] == 32 + pool.workers + 1
    assert sum(1 for _ in mapping) == 32


def test_a_map_over_the_rows_of_an_array_keeps_its_window_in_items(pool: fastpool.Pool) -> None:
    # a row may weigh anything (each chunk of rows can be copied into the arena)
    rows = np.zeros((100_000, 4))
    mapping = pool.map(_tasks.identity, rows, chunksize=5000)
    assert pool.stats()["chunks_submitted"] == _mapper.window(pool.workers, 5000)
    assert next(mapping).shape == (4,)
    mapping.close()  # type: ignore[attr-defined]
    column = np.zeros(100_000)  # a 1-D array's items are numbers: the compact window
    mapping = pool.map(_tasks.identity, column, chunksize=5000)
    assert pool.stats()["chunks_submitted"] - _mapper.window(pool.workers, 5000) >= 16
    mapping.close()  # type: ignore[attr-defined]


class InputBroke(Exception):
    pass


def _breaks_at(total: int, when: int) -> Iterator[int]:
    for i in range(total):
        if i == when:
            raise InputBroke(f"item {i} could not be read")
        yield i


def _until_error(results: Iterator[Any]) -> tuple[list[Any], BaseException | None]:
    got: list[Any] = []
    try:
        got.extend(results)
    except InputBroke as exc:
        return got, exc
    return got, None


@pytest.mark.parametrize("via", ["map", "imap_unordered", "amap"])
def test_an_input_that_breaks_yields_the_chunks_read_before_it_then_its_error(
    pool: fastpool.Pool, via: str
) -> None:
    """issue 23, defect 7 (CPython's test_imap_handle_iterable_exception): items 0-5 make three
    chunks of 2, item 7 breaks the fourth; the three come back, then the input's own error
    (item 6, read into the broken chunk, does not run)."""
    if via == "amap":

        async def collect() -> tuple[list[Any], BaseException | None]:
            got: list[Any] = []
            try:
                async for x in pool.amap(_tasks.double, _breaks_at(20, 7), chunksize=2):
                    got.append(x)
            except InputBroke as exc:
                return got, exc
            return got, None

        got, error = asyncio.run(collect())
    else:
        got, error = _until_error(getattr(pool, via)(_tasks.double, _breaks_at(20, 7), chunksize=2))
    assert sorted(got) == [0, 2, 4, 6, 8, 10]
    assert isinstance(error, InputBroke) and "item 7" in str(error)


def test_an_input_that_breaks_before_its_first_chunk_raises_at_the_call(
    pool: fastpool.Pool,
) -> None:
    with pytest.raises(InputBroke, match="item 0"):
        pool.map(_tasks.double, _breaks_at(5, 0), chunksize=2)


@pytest.mark.parametrize("chunksize", [None, 1, 2, 4])
def test_a_map_takes_any_items_an_executor_takes(pool: fastpool.Pool, chunksize: int) -> None:
    """issue 32, defect 3: after an item that is a tuple holding an array, the window's
    byte count met None and 7 and raised TypeError; ProcessPoolExecutor maps them."""
    arr = np.arange(1000.0)
    items = [(arr,), None, 7, (arr, 1), "x", [arr], arr, (), (None,)]
    got = list(pool.map(_tasks.type_name, items, chunksize=chunksize))
    assert got == [type(x).__name__ for x in items]
