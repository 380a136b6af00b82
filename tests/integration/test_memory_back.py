"""Memory comes back (issue 24, wanted 3): after a batch of large arrays sent by value,
the parent and the workers trim their arena regions once the pool is idle, so what the
arena holds falls to its warm reserve plus the blocks still in use; results the caller
still holds are intact.  Every wait is on what the kernel reports for the arena's
memfd (stats()["arena"]["held_bytes"]), never a sleep."""

from __future__ import annotations

import os

import _tasks
import numpy as np
import pytest
from _waiting import spy_select, wait_for

import fastpool
from fastpool._supervision import _memory_tick, _supervisor

MIB = 1 << 20
N = 4 * MIB  # float64: 32 MiB a slice


def doubled(x: np.ndarray) -> np.ndarray:
    return x * 2


@pytest.mark.parametrize("linger_s", [None, 0.0])
def test_a_batch_of_large_arrays_gives_its_memory_back_once_the_pool_is_idle(
    monkeypatch: pytest.MonkeyPatch, linger_s: float | None
) -> None:
    # 0.0: the supervisor would sleep once nothing is in flight and every worker has its
    # last memory sample, before the trim's quiet time (made longer here); it stays up
    # for the parent's trim (on a loaded machine the caller's last frees can come after
    # any fixed linger), then sleeps
    if linger_s is not None:
        monkeypatch.setattr(_supervisor, "IDLE_LINGER_S", linger_s)
        monkeypatch.setattr(_memory_tick, "TRIM_QUIET_S", 0.5)
    with fastpool.Pool(2) as pool:
        out = np.empty(8)
        for i, r in enumerate(pool.map(doubled, (np.full(N, i, float) for i in range(8)))):
            out[i] = r[0]
            del r
        assert list(out) == [2.0 * i for i in range(8)]
        mem = pool.stats()["arena"]

        def given_back() -> bool:
            m = pool.stats()["arena"]
            return m["held_bytes"] <= m["reserve_bytes"] + m["live_bytes"]

        wait_for(given_back, 30, lambda: f"the arena to trim: {pool.stats()['arena']}")
        after = pool.stats()["arena"]
        assert after["returned_bytes"] > 0
        assert after["held_bytes"] < mem["high_water_bytes"]


@pytest.mark.parametrize("kept", [0, 7])
def test_results_held_while_the_pool_trims_keep_their_data(kept):
    with fastpool.Pool(2) as pool:
        results = list(pool.map(doubled, (np.full(N, i, float) for i in range(8)), chunksize=1))
        mine = results[kept]
        del results

        def trimmed() -> bool:
            m = pool.stats()["arena"]
            return m["returned_bytes"] > 0 and m["held_bytes"] <= (
                m["reserve_bytes"] + m["live_bytes"]
            )

        wait_for(trimmed, 30, lambda: f"the arena to trim: {pool.stats()['arena']}")
        assert (mine == 2.0 * kept).all()
        # a second batch reuses the trimmed blocks
        again = list(pool.map(doubled, (np.full(N, i, float) for i in range(8)), chunksize=1))
        assert all((r == 2.0 * i).all() for i, r in enumerate(again))
        assert (mine == 2.0 * kept).all()


def churn(mib: int) -> int:
    """Makes and frees large temporaries (each a block of this worker's arena region, by
    the NumPy hook), as a task on a slice of a batch does; returns a small result."""
    for _ in range(3):
        t = np.ones(mib * MIB // 8)
        t += 1.0
        del t
    return mib


def test_a_task_that_churns_large_temporaries_gives_them_back_before_the_next_task(
    tmp_path,
) -> None:
    # A run of such tasks never idles, so without the trim after the task its region would
    # hold every task's temporaries until the run ends (the batch's peak, issue 24).  The
    # second task holds the worker on a gate: the worker took it without idling between.
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with fastpool.Pool(1) as pool:
        first = pool.submit(churn, 96)
        held = pool.submit(_tasks.announce_then_gate, started, gate)
        try:
            assert first.result(timeout=60) == 96
            wait_for(lambda: os.path.exists(started), 30, lambda: "the second task to start")
            arena = pool.stats()["arena"]
            assert arena["returned_bytes"] >= 64 * MIB, arena
        finally:
            open(gate, "w").close()
        assert held.result(timeout=60) == ""


def _parent_array(pool: fastpool.Pool, how: str) -> np.ndarray:
    """128 MiB of the parent's arena region, its pages faulted in."""
    if how == "share":
        return pool.share(np.ones(16 * MIB))
    if how == "empty":
        arr = pool.empty(16 * MIB)
        arr[...] = 1.0
        return arr
    with pool.arrays():
        return np.ones(16 * MIB)


@pytest.mark.parametrize("how", ["share", "empty", "arrays"])
def test_an_array_freed_while_the_pool_sleeps_is_given_back_and_the_pool_sleeps_again(
    how: str,
) -> None:
    """Issue 32, defect 5: the parent trimmed at the first tick after activity and then
    its supervisor slept, so an array freed later stayed resident while the pool idled
    (128 MiB still held 3 s later).  Freeing it wakes the supervisor, which trims, then
    sleeps again: an idle pool still costs nothing."""
    with fastpool.Pool(1) as pool:
        timeouts = spy_select(pool._sup)
        arr = _parent_array(pool, how)
        assert pool.submit(np.sum, arr).result(timeout=60) == 16 * MIB
        wait_for(lambda: timeouts[-1:] == [None], what=lambda: f"a sleep: {timeouts[-5:]}")
        held = pool.stats()["arena"]
        assert held["held_bytes"] >= 128 * MIB, held
        asleep, wakeups = len(timeouts), pool._sup.wakeups
        del arr

        def given_back() -> bool:
            m = pool.stats()["arena"]
            return m["held_bytes"] <= m["reserve_bytes"] + m["live_bytes"]

        wait_for(given_back, 30, lambda: f"the freed array's trim: {pool.stats()['arena']}")
        assert pool._sup.wakeups > wakeups  # the free woke it: nothing else would have
        wait_for(
            lambda: len(timeouts) > asleep and timeouts[-1] is None,
            what=lambda: f"the supervisor to sleep again: {timeouts[asleep:][-5:]}",
        )
