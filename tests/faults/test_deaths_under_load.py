"""A worker dies while its rings are full (issue 9, section 3).

At the moment of a death the dead worker's slot may hold, in ring order, tasks it
finished whose results the parent has not read yet, the task it was running, and
tasks it prefetched but never started.  The first kind must settle with their
results (never run again), the second is judged (WorkerCrashed), the third goes
back to the queue and runs once on the replacement.  Every task here appends its
id to a file with one O_APPEND write, so "ran exactly once" is counted, not
inferred.

To hold results unread, a done-callback parks the thread that consumes the result
rings (the collector) while the worker runs on: nothing is read until the test
lets it go, after the supervisor has queued the death.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from _faulty import append_id_then_die
from _tasks import announce_then_gate, append_id, append_id_padded, appended_ids, double
from _waiting import running, wait_for, wait_workers_ready

import fastpool
from fastpool import WorkerCrashed

pytestmark = [pytest.mark.faults, pytest.mark.linux]

MAX_PREFETCH = 16  # _dispatch.pyx: what a worker holds at most when tasks are short
# A ring that empties at offset X restarts at 0 for a record of up to X bytes and
# then holds that one record until its reader catches up (the bug
# test_ring_capacity.py shows).  Records bigger than whatever came before them in
# either ring keep both appending, so the worker really holds, and finishes, a
# full prefetch while nobody reads.
PAD = "p" * 8192


def _count_settles(futs: list) -> Counter:
    """Done-callback calls per future index: a future settled twice calls twice."""
    calls: Counter = Counter()
    lock = threading.Lock()

    def make(i: int):
        def cb(_f) -> None:
            with lock:
                calls[i] += 1

        return cb

    for i, f in enumerate(futs):
        f.add_done_callback(make(i))
    return calls


def _park_the_collector(pool: fastpool.Pool) -> threading.Event:
    """Warms the pool up to a full prefetch depth, then parks the thread that reads
    the result rings inside a done-callback; returns the event that lets it go.

    The callback goes on the last of 64 short tasks: the test thread drives
    nothing after its submits, so the collector settles that future, after the
    callback is attached."""
    entered, release = threading.Event(), threading.Event()
    where: list[str] = []

    def park(_f) -> None:
        where.append(threading.current_thread().name)
        entered.set()
        if threading.current_thread() is not threading.main_thread():
            release.wait(60)

    futs = [pool.submit(double, i) for i in range(64)]
    futs[-1].add_done_callback(park)
    assert entered.wait(30), "the parking callback never ran"
    assert where == ["fastpool-collector"], where
    assert pool.stats()["prefetch"] == MAX_PREFETCH
    return release


@pytest.mark.parametrize("killer_at", [1, 8, 15])
def test_death_with_unread_results_and_prefetched_tasks_runs_each_task_once(tmp_path, killer_at):
    """Task 0 holds the worker (a gate) until the slot holds a full prefetch; then
    tasks 1..killer_at-1 finish with nobody reading them, killer_at SIGKILLs the
    worker, and the rest of what it holds it never starts."""
    log, started, opener = str(tmp_path / "ran.log"), tmp_path / "started", tmp_path / "open"
    n = 200
    with fastpool.Pool(1, backoff_base_s=0.01) as pool:
        (pid,) = wait_workers_ready(pool)
        release = _park_the_collector(pool)
        try:
            futs = [pool.submit(announce_then_gate, str(started), str(opener), len(PAD))]
            # Running, so its record has left the task ring: the ring is empty, at
            # a small offset, and the padded records append behind it.
            wait_for(started.exists, what="the gate task to start")
            futs += [
                pool.submit(append_id_then_die, log, i, PAD)
                if i == killer_at
                else pool.submit(append_id_padded, log, i, PAD)
                for i in range(1, n)
            ]
            calls = _count_settles(futs)
            assert pool.stats()["workers"][0]["assigned"] == MAX_PREFETCH
            completed = pool.stats()["calls_completed"]
            opener.touch()
            wait_for(lambda: not running(pid), what=f"worker {pid} to die")
            wait_for(lambda: pool._sup._deaths, what="the supervisor to queue the death")
            assert appended_ids(log) == list(range(1, killer_at + 1))
            assert (
                pool.stats()["calls_completed"] == completed
            )  # none of their results was read yet
        finally:
            opener.touch()
            release.set()
        assert futs[0].result(timeout=60) == PAD
        for i, f in enumerate(futs[1:], 1):
            if i == killer_at:
                with pytest.raises(WorkerCrashed):
                    f.result(timeout=60)
            else:
                assert f.result(timeout=60) == [i, PAD]
        wait_for(lambda: len(calls) == n, what=lambda: f"{n - len(calls)} more done-callbacks")
        assert set(calls.values()) == {1}
        ran = Counter(appended_ids(log))
        assert sorted(ran) == list(range(1, n))  # the killer too: it appended before dying
        assert [i for i, c in ran.items() if c != 1] == []  # none ran twice
        stats = pool.stats()
        assert (stats["crashed"], stats["retried"], stats["calls_failed"]) == (1, 0, 1)


def test_many_deaths_among_many_tasks_run_each_task_once(tmp_path):
    """No parking: 2 workers, 240 tasks, every 60th kills its worker.  The deaths
    land wherever the collector happens to be; the count must come out the same."""
    log = str(tmp_path / "ran.log")
    n, every = 240, 60
    with fastpool.Pool(2, backoff_base_s=0.01, max_queue=1024) as pool:
        futs = [
            pool.submit(append_id_then_die if i % every == every - 1 else append_id, log, i)
            for i in range(n)
        ]
        calls = _count_settles(futs)
        for i, f in enumerate(futs):
            if i % every == every - 1:
                with pytest.raises(WorkerCrashed):
                    f.result(timeout=60)
            else:
                assert f.result(timeout=60) == i
        wait_for(lambda: len(calls) == n, what=lambda: f"{n - len(calls)} more done-callbacks")
        assert set(calls.values()) == {1}
        ran = Counter(appended_ids(log))
        assert sorted(ran) == list(range(n))
        assert [i for i, c in ran.items() if c != 1] == []
        assert pool.stats()["crashed"] == n // every


def test_pure_task_retried_after_a_death_under_load_runs_twice_and_others_once(tmp_path):
    """A pure=True task that kills its worker is retried once (PoisonTask on the
    second death); the tasks around it still run once each."""
    log = str(tmp_path / "ran.log")
    with fastpool.Pool(1, backoff_base_s=0.01) as pool:
        before = [pool.submit(append_id, log, i) for i in range(20)]
        poison = pool.options(pure=True).submit(append_id_then_die, log, 20)
        after = [pool.submit(append_id, log, i) for i in range(21, 40)]
        with pytest.raises(fastpool.PoisonTask):
            poison.result(timeout=60)
        assert [f.result(timeout=60) for f in before + after] == [i for i in range(40) if i != 20]
        ran = Counter(appended_ids(log))
        assert ran[20] == 2  # the first attempt and its one retry
        assert {i: c for i, c in ran.items() if i != 20 and c != 1} == {}
        assert pool.stats()["retried"] == 1
