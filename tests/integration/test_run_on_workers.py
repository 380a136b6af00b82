"""Pool.run_on_workers: one call in every live worker, gathered by slot (docs/state.md).

State an initializer builds is changed by tasks and read back by the call; a busy
worker answers after the tasks it holds; a worker killed during the call fails that
slot's call with WorkerCrashed and its replacement starts from the initializer again;
a held call never runs on the replacement; calls from many threads are neither lost
nor doubled.  Every wait is on an event (a file a task writes, a state the pool
reports), never on a sleep.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from _state_tasks import (
    bump,
    count_item,
    counted,
    log_so_far,
    logged,
    logged_after_gate,
    pid_after_gate,
    reset,
)
from _tasks import identity, raise_value_error
from _waiting import wait_for

import fastpool
from fastpool import errors


def test_counters_built_by_the_initializer_are_gathered_from_every_worker():
    # workers still starting are waited for: the first call sees both
    with fastpool.Pool(2, initializer=reset) as pool:
        assert pool.run_on_workers(counted) == {0: 0, 1: 0}
        assert sum(pool.map(count_item, range(500), chunksize=7)) == sum(range(500))
        counts = pool.run_on_workers(counted)
        assert sorted(counts) == [0, 1]
        assert sum(counts.values()) == 500
        assert pool.run_on_workers(identity, "x") == {0: "x", 1: "x"}


def test_a_busy_worker_answers_after_its_task_and_before_work_queued_later(tmp_path):
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with fastpool.Pool(1, initializer=reset) as pool:
        running = pool.submit(logged_after_gate, "running", started, gate)
        wait_for(lambda: os.path.exists(started), what="the task to start")
        got: list = []
        caller = threading.Thread(target=lambda: got.append(pool.run_on_workers(log_so_far)))
        caller.start()
        wait_for(lambda: pool.stats()["inflight"] == 2, what="the call to be accepted")
        later = pool.submit(logged, "later")
        open(gate, "w").close()
        caller.join(30)
        assert got == [{0: ["running"]}]
        assert running.result(30) == "running" and later.result(30) == "later"


def test_a_worker_killed_during_the_call_fails_its_slot_with_worker_crashed(tmp_path):
    directory, gate = tmp_path / "in", str(tmp_path / "gate")
    directory.mkdir()
    with fastpool.Pool(2, initializer=reset) as pool:
        list(pool.map(count_item, range(40), chunksize=1))
        got: list = []

        def call() -> None:
            got.append(pool.run_on_workers(pid_after_gate, str(directory), gate, on_error="return"))

        caller = threading.Thread(target=call)
        caller.start()
        wait_for(lambda: len(os.listdir(directory)) == 2, what="both workers to run the call")
        victim, survivor = sorted(int(p) for p in os.listdir(directory))
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: victim not in pool.pids(), what="the death to be judged")
        open(gate, "w").close()
        caller.join(30)
        [result] = got
        [dead] = [s for s, v in result.items() if isinstance(v, BaseException)]
        exc = result[dead]
        assert isinstance(exc, errors.WorkerCrashed)
        assert (exc.worker_id, exc.pid, exc.exitcode) == (dead, victim, -signal.SIGKILL)
        assert result[1 - dead] == survivor
        # the replacement's state is the initializer's again; the survivor kept its count
        counts = wait_for(
            lambda: len(pool.run_on_workers(counted)) == 2 and pool.run_on_workers(counted)
        )
        assert counts[dead] == 0


def test_on_error_raise_raises_the_dead_slots_exception_after_every_call_settled(tmp_path):
    directory, gate = tmp_path / "in", str(tmp_path / "gate")
    directory.mkdir()
    with fastpool.Pool(2, initializer=reset) as pool:

        def kill_one_then_open() -> None:
            wait_for(lambda: len(os.listdir(directory)) == 2, what="both workers to run the call")
            os.kill(min(int(p) for p in os.listdir(directory)), signal.SIGKILL)
            open(gate, "w").close()

        opener = threading.Thread(target=kill_one_then_open)
        opener.start()
        with pytest.raises(errors.WorkerCrashed) as info:
            pool.run_on_workers(pid_after_gate, str(directory), gate)
        opener.join(30)
        assert info.value.exitcode == -signal.SIGKILL
        # a slot backing off before its replacement starts is left out, then back
        wait_for(lambda: len(pool.pids()) == 2, what="the replacement to start")
        assert pool.run_on_workers(identity, 1) == {0: 1, 1: 1}


def test_a_call_held_by_a_worker_that_dies_never_runs_on_its_replacement(tmp_path):
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with fastpool.Pool(1, initializer=reset) as pool:
        pid = pool.run_on_workers(os.getpid)[0]
        running = pool.submit(logged_after_gate, "running", started, gate)
        wait_for(lambda: os.path.exists(started), what="the task to start")
        got: list = []
        caller = threading.Thread(
            target=lambda: got.append(pool.run_on_workers(bump, on_error="return"))
        )
        caller.start()
        wait_for(lambda: pool.stats()["inflight"] == 2, what="the call to be accepted")
        os.kill(pid, signal.SIGKILL)
        caller.join(30)
        [result] = got
        assert isinstance(result[0], errors.WorkerCrashed)
        assert "does not run on its replacement" in str(result[0])
        with pytest.raises(errors.WorkerCrashed):
            running.result(30)
        wait_for(lambda: pool.pids(), what="the replacement to start")
        assert pool.run_on_workers(counted) == {0: 0}  # the replacement never ran bump


def test_calls_from_many_threads_each_run_once_in_every_worker():
    threads, calls = 4, 25
    with fastpool.Pool(2, initializer=reset) as pool:
        start = threading.Barrier(threads)
        seen: list = []
        failures: list = []

        def caller() -> None:
            try:
                start.wait(30)
                for _ in range(calls):
                    seen.append(pool.run_on_workers(bump))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        workers = [threading.Thread(target=caller) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
        assert failures == []
        assert len(seen) == threads * calls and all(sorted(d) == [0, 1] for d in seen)
        for slot in (0, 1):  # each worker counted every call once: 1..N, no gap, no repeat
            assert sorted(d[slot] for d in seen) == list(range(1, threads * calls + 1))
        assert pool.run_on_workers(counted) == {0: threads * calls, 1: threads * calls}


def test_a_call_that_raises_and_the_ways_to_get_its_error():
    with fastpool.Pool(2) as pool:
        with pytest.raises(ValueError, match="boom"):
            pool.run_on_workers(raise_value_error, "boom")
        got = pool.run_on_workers(raise_value_error, "boom", on_error="return")
        assert sorted(got) == [0, 1] and all(isinstance(v, ValueError) for v in got.values())
        assert pool.run_on_workers(raise_value_error, "boom", on_error="ignore") == {}
        with pytest.raises(ValueError, match="on_error"):
            pool.run_on_workers(identity, 1, on_error="warn")  # type: ignore[call-overload]


def test_a_timeout_drops_calls_not_started(tmp_path):
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with fastpool.Pool(1, initializer=reset) as pool:
        running = pool.submit(logged_after_gate, "running", started, gate)
        wait_for(lambda: os.path.exists(started), what="the task to start")
        with pytest.raises(TimeoutError, match=r"slot\(s\) \[0\]"):
            pool.run_on_workers(bump, timeout=0.05)
        open(gate, "w").close()
        assert running.result(30) == "running"
        assert pool.run_on_workers(counted) == {0: 0}  # the dropped bump never ran


def test_after_shutdown_it_raises_pool_closed():
    pool = fastpool.Pool(1)
    pool.shutdown()
    with pytest.raises(fastpool.PoolClosed):
        pool.run_on_workers(identity, 1)
