"""How a pool ends: shut down from anywhere, even from one of its own callbacks, or
dropped and collected (issue 9, section 5): a pool nobody shuts down shuts itself down.

Like ProcessPoolExecutor: the pool's threads and the dispatcher hold no reference
to the Pool object, so when the caller drops it, it is garbage collected and its
finalizer starts the shutdown.  Its workers exit and its threads end; futures the
caller still holds keep (or still get) their results.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref

from _tasks import announce_then_gate, double, gate
from _waiting import wait_for, wait_gone, wait_workers_ready

import fastpool


def _pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fastpool-")]


def _dropped(make) -> tuple[weakref.ref, list[int], object]:
    """Runs make(pool) on a fresh pool inside a frame that then ends; returns a weak
    reference to the pool, its workers' pids and whatever make returned."""
    pool = fastpool.Pool(2)
    pids = wait_workers_ready(pool)
    kept = make(pool)
    return weakref.ref(pool), pids, kept


def _collected(ref: weakref.ref, pids: list[int]) -> None:
    gc.collect()
    assert ref() is None, gc.get_referrers(ref())
    wait_gone(pids)
    wait_for(
        lambda: not _pool_threads(), what=lambda: f"the pool's threads to end: {_pool_threads()}"
    )


def test_a_dropped_pool_is_collected_and_its_workers_exit():
    assert _pool_threads() == []

    def use(pool):
        assert pool.submit(double, 21).result(timeout=30) == 42
        assert list(pool.map(double, range(10))) == [2 * i for i in range(10)]

    ref, pids, _ = _dropped(use)
    _collected(ref, pids)


def test_a_dropped_pool_whose_finished_future_the_caller_holds_is_collected():
    def use(pool):
        fut = pool.submit(double, 21)
        assert fut.result(timeout=30) == 42
        return fut

    ref, pids, fut = _dropped(use)
    _collected(ref, pids)
    assert fut.result(timeout=0) == 42 and fut.done()


def test_a_dropped_pool_finishes_every_task_it_accepted(tmp_path):
    """Collected while both workers run gated tasks and more wait in the queue:
    the finalizer's shutdown keeps the queue (as concurrent.futures does: only
    cancel_futures=True drops work), so queued and running tasks all settle with
    their results, and then the workers exit."""
    opener = tmp_path / "open"

    def use(pool):
        running = []
        for i in range(2):
            started = tmp_path / f"started-{i}"
            running.append(pool.submit(announce_then_gate, str(started), str(opener), 3))
            wait_for(started.exists, what=f"gated task {i} to start")
        queued = [pool.submit(double, i) for i in range(20)]
        assert pool.stats()["queued"] == 20  # no short task ran yet: nothing is prefetched
        return running, queued

    ref, pids, (running, queued) = _dropped(use)
    gc.collect()
    assert ref() is None  # collected while its tasks still run
    assert not any(f.done() for f in queued)
    opener.touch()
    assert [f.result(timeout=30) for f in running] == ["ppp", "ppp"]
    assert [f.result(timeout=30) for f in queued] == [2 * i for i in range(20)]
    wait_gone(pids)
    wait_for(
        lambda: not _pool_threads(), what=lambda: f"the pool's threads to end: {_pool_threads()}"
    )


def test_a_pool_dropped_without_any_task_is_collected():
    ref, pids, _ = _dropped(lambda pool: None)
    _collected(ref, pids)


def test_arrays_a_collected_pool_handed_out_stay_valid():
    """Arrays it handed out stay valid after the collection (docs/arrays.md)."""

    def use(pool):
        arr = pool.zeros(1 << 17)
        arr[:] = 3
        return arr

    ref, pids, arr = _dropped(use)
    _collected(ref, pids)
    assert arr.sum() == 3 * (1 << 17)


def test_pools_made_and_dropped_in_a_loop_do_not_accumulate():
    for _ in range(3):
        ref, pids, _ = _dropped(lambda pool: pool.submit(double, 1).result(timeout=30))
        _collected(ref, pids)


def test_shutdown_wait_from_a_done_callback_does_not_deadlock(tmp_path):
    fds = len(os.listdir("/proc/self/fd"))
    opened = tmp_path / "open"
    p = fastpool.Pool(1)
    f = p.submit(gate, str(opened), 1)  # not done before the callback is added
    done = threading.Event()
    threads: list = []
    f.add_done_callback(
        lambda fut: (threads.append(threading.current_thread()), p.shutdown(wait=True), done.set())
    )
    opened.touch()
    # Waiting on the event, not in f.result(): a thread inside result() drives the
    # pool itself and would run the callback, and the claim is about the pool's thread.
    assert done.wait(30)  # the callback returned instead of waiting on its own thread
    assert threads != [threading.main_thread()]
    assert f.result(timeout=0)[0] == 1
    p.shutdown(wait=True)
    wait_for(
        lambda: len(os.listdir("/proc/self/fd")) == fds,
        10,
        "the collector to finish the teardown and close its fds",
    )
