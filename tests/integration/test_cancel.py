"""Cancellation that does what it says (issue 9, section 4).

Where a task can be when it is cancelled, and what each way of cancelling does:

    queued (no worker holds it)      future.cancel(), pool.cancel(): dropped, never run
    prefetched (held, not started)   pool.cancel(force=False/True): dropped, never run;
                                     future.cancel(): False, it runs (as in
                                     ProcessPoolExecutor: a held task is RUNNING)
    running                          pool.cancel(): False, only the flag
                                     fastpool.cancelled() reads is set;
                                     force=True: the worker is killed and replaced
    finished                         False, the result stays

"Never run" is a side effect a test can see: the task creates a file.  A held task
is made by a warm pool (prefetch depth above 1) whose only worker is held on a gate.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from concurrent.futures import CancelledError

import pytest
from _faulty import announce_then_gate_then_die
from _tasks import announce_then_gate, append_id, appended_ids, cooperative, double, touch
from _waiting import wait_for, wait_workers_ready

import fastpool

GATE_S = 30.0  # a gate nobody opens lets its worker go after this long


class Held:
    """Pool(1) whose worker runs a gate task, with room behind it to prefetch."""

    def __init__(self, pool: fastpool.Pool, tmp_path, gate_fn=announce_then_gate) -> None:
        self.pool = pool
        self.opener = tmp_path / "open"
        started = tmp_path / "started"
        (self.pid,) = wait_workers_ready(pool)
        # Short tasks first: the prefetch depth grows past 1, so a busy worker
        # is handed more than the task it runs.
        assert list(pool.map(double, range(64), chunksize=1)) == [2 * i for i in range(64)]
        assert pool.stats()["prefetch"] > 1
        self.gate = pool.submit(gate_fn, str(started), str(self.opener))
        wait_for(started.exists, what="the gate task to start")

    def assigned(self) -> int:
        return self.pool.stats()["workers"][0]["assigned"]

    def open(self) -> None:
        self.opener.touch()


@pytest.fixture
def pool():
    with fastpool.Pool(1, backoff_base_s=0.01) as p:
        yield p


def _after_the_worker_passed(pool: fastpool.Pool) -> None:
    """One more task, run after everything submitted before it (one worker, FIFO)."""
    assert pool.submit(double, 21).result(timeout=30) == 42


@pytest.mark.parametrize("force", [False, True])
def test_pool_cancel_of_a_prefetched_task_never_runs_it(pool, tmp_path, force):
    held = Held(pool, tmp_path)
    side = tmp_path / "victim-ran"
    victim = pool.submit(touch, str(side))
    assert held.assigned() >= 2, pool.stats()["workers"]  # the gate and the victim: prefetched
    assert victim.running()  # held by the worker: future.cancel() could not take it back
    assert pool.cancel(victim, force=force) is True
    held.open()
    assert held.gate.result(timeout=30) == ""
    with pytest.raises(CancelledError):
        victim.result(timeout=30)
    assert victim.cancelled()
    with pytest.raises(CancelledError):
        victim.exception(timeout=0)
    _after_the_worker_passed(pool)
    assert not side.exists()  # it never ran
    assert pool.pids() == [held.pid]  # not started, so nothing was killed, even with force
    stats = pool.stats()
    assert (stats["calls_cancelled"], stats["killed"], stats["crashed"]) == (1, 0, 0)


def test_pool_cancel_of_a_prefetched_task_cancels_its_future_at_once(pool, tmp_path):
    """pool.cancel's docstring: 'the future is cancelled'.  A caller that gets True
    and then waits on the future must not wait for the task in front of it."""
    held = Held(pool, tmp_path)
    victim = pool.submit(touch, str(tmp_path / "victim-ran"))
    assert held.assigned() >= 2
    try:
        assert pool.cancel(victim) is True
        assert victim.cancelled()  # today: False while the gate holds the worker
        assert victim.done()
    finally:
        held.open()


@pytest.mark.faults
def test_a_cancelled_prefetched_task_is_not_run_by_the_replacement_when_its_worker_dies(
    pool, tmp_path
):
    held = Held(pool, tmp_path, gate_fn=announce_then_gate_then_die)
    side = tmp_path / "victim-ran"
    victim = pool.submit(touch, str(side))
    assert held.assigned() >= 2
    assert pool.cancel(victim) is True
    held.open()  # the gate task now kills its worker, before it reaches the victim
    with pytest.raises(fastpool.WorkerCrashed):
        held.gate.result(timeout=30)
    with pytest.raises(CancelledError):
        victim.result(timeout=30)
    _after_the_worker_passed(pool)
    assert not side.exists()  # today: the replacement ran it


def test_future_cancel_of_a_prefetched_task_returns_false_and_the_task_runs(pool, tmp_path):
    """Documented: once a worker holds a task its future is RUNNING, as in
    ProcessPoolExecutor, and Future.cancel() says False; pool.cancel() can drop it."""
    held = Held(pool, tmp_path)
    side = tmp_path / "victim-ran"
    victim = pool.submit(touch, str(side))
    assert held.assigned() >= 2
    assert victim.cancel() is False
    held.open()
    assert victim.result(timeout=30) == str(side)
    assert side.exists() and not victim.cancelled()


def test_pool_cancel_of_a_queued_task_cancels_it_at_once_and_it_never_runs(pool, tmp_path):
    held = Held(pool, tmp_path)
    log = str(tmp_path / "ran.log")
    futs = [pool.submit(append_id, log, i) for i in range(40)]  # more than any prefetch
    assert pool.stats()["queued"] > 0
    victim = futs[-1]
    assert not victim.running()  # still in the parent's queue
    try:
        assert pool.cancel(victim) is True
        assert victim.cancelled() and victim.done()  # at once: nothing had it
    finally:
        held.open()
    assert [f.result(timeout=30) for f in futs[:-1]] == list(range(39))
    with pytest.raises(CancelledError):
        victim.result(timeout=0)
    _after_the_worker_passed(pool)
    assert appended_ids(log) == list(range(39))


def test_cooperative_cancel_ends_as_a_cancelled_future(pool, tmp_path):
    """The task polls fastpool.cancelled() and returns early; its future behaves
    as Future.cancel() leaves one, and the worker lives on."""
    (pid,) = wait_workers_ready(pool)
    fut = pool.submit(cooperative, 60)
    wait_for(lambda: pool.stats()["workers"][0]["current_task"], what="the task to start")
    callbacks = []
    fut.add_done_callback(callbacks.append)
    assert pool.cancel(fut) is False  # only asked: it stops when the task reads the flag
    with pytest.raises(CancelledError):
        fut.result(timeout=30)
    assert fut.cancelled() and fut.done() and not fut.running()
    with pytest.raises(CancelledError):
        fut.exception(timeout=0)
    assert callbacks == [fut]
    assert pool.pids() == [pid]
    stats = pool.stats()
    assert (
        stats["calls_cancelled"],
        stats["calls_completed"],
        stats["killed"],
        stats["crashed"],
    ) == (
        1,
        0,
        0,
        0,
    )
    assert pool.submit(double, 2).result(timeout=30) == 4


def test_cancel_of_a_running_task_that_never_polls_says_it_did_not_stop_it(pool, tmp_path):
    """Issue 23, defect 12: a cooperative cancel that no task reads is no stop.  It
    returned True, while the future stayed pending until the task ended (and a `with`
    block waited for it).  The future ends cancelled once the task returns."""
    held = Held(pool, tmp_path)
    assert pool.cancel(held.gate) is False
    assert held.gate.running() and not held.gate.done()  # still running: nothing stopped it
    held.open()
    with pytest.raises(CancelledError):
        held.gate.result(timeout=30)
    assert pool.pids() == [held.pid]


def test_force_cancel_of_a_running_task_is_a_kill_not_a_crash(pool, tmp_path, caplog):
    held = Held(pool, tmp_path)
    with caplog.at_level(logging.WARNING, logger="fastpool"):
        assert pool.cancel(held.gate, force=True) is True
        with pytest.raises(CancelledError):
            held.gate.result(timeout=30)
        assert held.gate.cancelled()
        _after_the_worker_passed(pool)
    stats = pool.stats()
    assert (stats["killed"], stats["crashed"], stats["calls_cancelled"]) == (1, 0, 1)
    assert stats["crashes"][-1]["cause"] == "cancelled"
    assert held.pid not in pool.pids()
    mine = [r for r in caplog.records if r.name == "fastpool"]
    assert mine and all(r.levelno == logging.WARNING for r in mine), [
        (r.levelname, r.message) for r in mine
    ]


def test_cancel_of_a_finished_future_returns_false_and_keeps_the_result(pool):
    fut = pool.submit(double, 4)
    assert fut.result(timeout=30) == 8
    assert pool.cancel(fut) is False
    assert pool.cancel(fut, force=True) is False
    assert fut.cancel() is False
    assert fut.result() == 8 and not fut.cancelled()


def test_shutdown_cancel_futures_cancels_queued_tasks_and_runs_held_ones(tmp_path):
    log = str(tmp_path / "ran.log")
    p = fastpool.Pool(1)
    try:
        held = Held(p, tmp_path)
        futs = [p.submit(append_id, log, i) for i in range(40)]
        prefetched = held.assigned() - 1  # behind the gate, in ring order: ids 0 .. prefetched-1
        assert p.stats()["queued"] == 40 - prefetched > 0
        p.shutdown(wait=False, cancel_futures=True)
        queued = futs[prefetched:]
        assert all(f.cancelled() for f in queued)  # at once, before the worker is free
        with pytest.raises(fastpool.PoolClosed):
            p.submit(double, 1)
    finally:
        held.open()
        p.shutdown(wait=True)
    assert [f.result(timeout=0) for f in futs[:prefetched]] == list(range(prefetched))
    assert appended_ids(log) == list(range(prefetched))


def test_a_waiter_in_concurrent_futures_wait_sees_a_pool_cancel(pool, tmp_path):
    held = Held(pool, tmp_path)
    futs = [pool.submit(double, i) for i in range(40)]
    victim = futs[-1]
    out = []
    waiter = threading.Thread(
        target=lambda: out.append(concurrent.futures.wait([victim], timeout=30))
    )
    waiter.start()
    try:
        assert pool.cancel(victim)
        waiter.join(30)
        assert not waiter.is_alive()
        done, not_done = out[0]
        assert done == {victim} and not not_done
    finally:
        held.open()
    assert [f.result(timeout=30) for f in futs[:-1]] == [2 * i for i in range(39)]


def test_pool_cancel_refuses_a_future_of_another_pool(pool):
    with fastpool.Pool(1) as other:
        fut = other.submit(double, 1)
        with pytest.raises(TypeError):
            pool.cancel(fut)
        assert fut.result(timeout=30) == 2
