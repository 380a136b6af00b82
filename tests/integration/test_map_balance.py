"""A map is balanced whatever its items cost (issue 31, item 2): without a chunksize,
no long item waits behind another on one worker while the other worker is free, with
a length or without, through every map fastpool offers.

The items run a known minimum (so that the engine measures them as long) and
synchronise on files the items themselves create: what a test asserts never depends
on how fast the machine is, only on where the engine put each item."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, Iterable

import _tasks
import pytest
from _waiting import wait_workers_ready

import fastpool
import fastpool.mp

N = 24  # with a length, the engine before issue 31 cut 24 items into chunks of 2
LONG_S = 0.05  # each item's own run time: the engine measures 50 ms, not microseconds


def _args(sized: bool, directory: Path, n: int = N) -> Iterable[tuple]:
    """The items as argument tuples: a list (a length) or a generator (none)."""
    args = ((i, str(directory), n, LONG_S) for i in range(n))
    return list(args) if sized else args


def _columns(sized: bool, directory: Path, n: int = N) -> tuple[Iterable[Any], ...]:
    """The same as map's iterables: all with a length, or a generator first."""
    if sized:
        return range(n), [str(directory)] * n, [n] * n, [LONG_S] * n
    rest = itertools.repeat(str(directory)), itertools.repeat(n), itertools.repeat(LONG_S)
    return (i for i in range(n)), *rest


def _check_handed_on(results: list, n: int = N) -> None:
    assert [r[0] for r in results] == list(range(n))
    stuck = [i for i, _pid, ok in results if ok is False]
    assert stuck == [], f"item {stuck} held the worker the next item needed"
    assert all(ok for _i, _pid, ok in results)
    pids = [pid for _i, pid, _ok in results]
    assert all(a != b for a, b in itertools.pairwise(pids)), pids


def _amap(pool: fastpool.Pool, fn: Any, *iterables: Iterable[Any]) -> list:
    async def main() -> list:
        return [r async for r in pool.amap(fn, *iterables)]

    return asyncio.run(main())


@pytest.mark.parametrize("sized", [True, False], ids=["with-length", "generator"])
@pytest.mark.parametrize("how", ["map", "imap_unordered", "amap"])
@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "after-tiny-tasks"])
def test_long_items_never_wait_behind_each_other_on_one_worker(
    tmp_path: Path, sized: bool, how: str, warm: bool
) -> None:
    # Each item holds its worker until the next one has started: only the other worker
    # can start it, so two consecutive items in one chunk, or one queued behind the
    # other while the second worker idles, would stall (and say so in the results).
    with fastpool.Pool(2) as pool:
        # Both workers up first: with one still starting, the dispatcher queues tasks
        # behind a running one in the other (after tiny tasks), which is not the engine's
        wait_workers_ready(pool)
        if warm:  # tiny tasks first: the dispatcher then queues tasks ahead in workers
            assert sum(pool.map(abs, range(20_000))) == sum(range(20_000))
        if how == "map":
            results = list(pool.map(_tasks.hand_on, *_columns(sized, tmp_path)))
        elif how == "amap":
            results = _amap(pool, _tasks.hand_on, *_columns(sized, tmp_path))
        else:
            results = sorted(pool.imap_unordered(_tasks.star_hand_on, _args(sized, tmp_path)))
    _check_handed_on(results)


@pytest.mark.parametrize("sized", [True, False], ids=["with-length", "generator"])
@pytest.mark.parametrize("call", ["map", "starmap", "map_async"])
def test_the_multiprocessing_drop_in_balances_long_items(
    tmp_path: Path, sized: bool, call: str
) -> None:
    with fastpool.mp.Pool(2) as pool:
        wait_workers_ready(pool._st.pool)  # as above
        if call == "map":
            results = pool.map(_tasks.star_hand_on, _args(sized, tmp_path))
        elif call == "starmap":
            results = pool.starmap(_tasks.hand_on, _args(sized, tmp_path))
        else:
            results = pool.map_async(_tasks.star_hand_on, _args(sized, tmp_path)).get(120)
    _check_handed_on(results)


@pytest.mark.parametrize("sized", [True, False], ids=["with-length", "generator"])
@pytest.mark.parametrize("how", ["map", "amap"])
def test_a_long_head_does_not_starve_the_other_worker_in_the_first_round(
    tmp_path: Path, sized: bool, how: str
) -> None:
    # Item 0 holds worker A until every other item has ended, so they all run on worker
    # B while an ordered map waits for item 0: the engine must size and send the next
    # chunks when item 1 settles, not only once the consumer has item 0.
    n = 8
    columns = _columns(sized, tmp_path, n)
    with fastpool.Pool(2) as pool:
        wait_workers_ready(pool)
        if how == "map":
            results = list(pool.map(_tasks.held_until_the_rest_ran, *columns))
        else:
            results = _amap(pool, _tasks.held_until_the_rest_ran, *columns)
    assert [r[0] for r in results] == list(range(n))
    assert results[0][2], "item 0 waited for items the other worker never got"
    assert len({pid for _i, pid, _ok in results[1:]}) == 1
