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


def churn(mib: int, times: int = 3) -> int:
    """Makes and frees large temporaries (each a block of this worker's arena region, by
    the NumPy hook), as a task on a slice of a batch does; returns a small result."""
    for _ in range(times):
        t = np.ones(mib * MIB // 8)
        t += 1.0
        del t
    return mib


def big(mib: int) -> np.ndarray:
    """A large result the NumPy hook made in the worker's region: handed to the parent."""
    return np.full(mib * MIB // 8, 2.0)


def gated_big(started: str, gate: str, mib: int) -> np.ndarray:
    _tasks.touch(started)
    _tasks.open_gate(gate)
    return big(mib)


def test_a_run_keeps_the_temporaries_its_recent_tasks_reuse_and_gives_back_the_rest(
    tmp_path,
) -> None:
    # A run of such tasks never idles.  Temporaries the recent tasks took again stay warm
    # (a trim would cost each task their page faults again); what none of the last
    # TRIM_WINDOW tasks needed goes back before the next task, so a run that moved on to
    # smaller slices does not hold the high water of an earlier one until it ends.
    # Each gate task holds the worker: it took it without idling between.
    from fastpool._runtime._serve import TRIM_WINDOW

    s1, g1 = str(tmp_path / "s1"), str(tmp_path / "g1")
    s2, g2 = str(tmp_path / "s2"), str(tmp_path / "g2")
    with fastpool.Pool(1) as pool:
        futs = [pool.submit(churn, 96)]
        futs += [pool.submit(churn, 8, 10) for _ in range(TRIM_WINDOW - 1)]  # 80 MiB freed each
        held1 = pool.submit(_tasks.announce_then_gate, s1, g1)
        futs.append(pool.submit(churn, 8, 10))
        held2 = pool.submit(_tasks.announce_then_gate, s2, g2)
        try:
            wait_for(lambda: os.path.exists(s1), 60, lambda: "the first gate task to start")
            arena = pool.stats()["arena"]
            assert arena["returned_bytes"] < 64 * MIB, arena  # the 96 MiB block stayed warm
        finally:
            open(g1, "w").close()
        try:
            wait_for(lambda: os.path.exists(s2), 60, lambda: "the second gate task to start")
            arena = pool.stats()["arena"]
            assert arena["returned_bytes"] >= 64 * MIB, arena  # the 88 MiB no task reused
        finally:
            open(g2, "w").close()
        assert [f.result(timeout=60) for f in futs] == [96] + [8] * TRIM_WINDOW
        assert held1.result(timeout=60) == held2.result(timeout=60) == ""


def test_a_task_that_returns_a_large_array_does_not_trim(tmp_path) -> None:
    # The result is handed to the parent, not freed: it is no churn.  Counted as churn, it
    # trimmed after every such task, and the next one took its block's pages again
    # (issue 31: `return a * 2` on 80 MiB, 80-97 ms a call against 14-24 ms).  Here two
    # 48 MiB blocks the parent freed while the last task ran lie warm between live ones,
    # each too small for its 64 MiB result: a trim after it would give one or both back.
    s, g = str(tmp_path / "s"), str(tmp_path / "g")
    s2, g2 = str(tmp_path / "s2"), str(tmp_path / "g2")
    with fastpool.Pool(1) as pool:
        kept = [pool.submit(big, 48).result(timeout=60) for _ in range(4)]  # back to back
        last = pool.submit(gated_big, s, g, 64)
        held = pool.submit(_tasks.announce_then_gate, s2, g2)
        try:
            wait_for(lambda: os.path.exists(s), 60, lambda: "the last task to start")
            assert all((k == 2.0).all() for k in kept)
            del kept[2], kept[0]
            open(g, "w").close()
            wait_for(lambda: os.path.exists(s2), 60, lambda: "the gate task to start")
            arena = pool.stats()["arena"]
            assert arena["returned_bytes"] < 32 * MIB, arena
        finally:
            open(g, "w").close()
            open(g2, "w").close()
        assert (last.result(timeout=60) == 2.0).all()
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
