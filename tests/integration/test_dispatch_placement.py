"""While tasks are short, a worker on the submitting thread's CPU gets tasks last.

A task pushed to a parked worker that shares the submitting thread's CPU wakes it
right there: it preempts the submitter, runs one task and parks again, two context
switches per task.  The dispatcher reads where each worker last ran (a word each
worker publishes after a task) and sends a short task to an idle worker elsewhere
before the warmest idle worker when the warmest is beside the submitter.

The scheduler decides placement, so the test makes it: the submitting thread and
the warm worker on one CPU, the other worker on another (a process may set the
affinity of its own descendants).  Only this thread and the two workers are moved:
the pool's own threads, and the template later pools fork from, keep theirs.  The
words the workers would publish at their next task are written for them, so the
first task measured already sees the placement.

Lone round trips keep both workers idle at every choice, so the outcome does not
depend on how fast either runs: without the preference the warmest idle worker
(the one beside) takes every task.  A busy worker elsewhere is never preferred to
an idle one beside: a task queued behind one that blocks would wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator

import pytest
from _tasks import announce_then_gate, double, noop
from _waiting import wait_for, wait_workers_ready

import fastpool

ROUND_TRIPS = 200
_CPU_WORD = 12  # fp_slot_t: state, pid, generation, then cpu (fp_cpu_tag: the CPU plus one)

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs this process may run on, to put a worker on each",
)


def _served(pool: fastpool.Pool) -> dict[int, int]:
    return {w["pid"]: w["served"] for w in pool.stats()["workers"]}


def _publish_cpu(pool: fastpool.Pool, pid: int, cpu: int) -> None:
    lay = pool._board.layout()
    (slot,) = [w["slot"] for w in pool.stats()["workers"] if w["pid"] == pid]
    ctypes.c_uint32.from_address(lay["base"] + lay["slots"][slot] + _CPU_WORD).value = cpu + 1


@contextlib.contextmanager
def _placed(pool: fastpool.Pool) -> Iterator[tuple[int, int]]:
    """Short tasks first (the prefetch depth rises above 1); then the warmest worker
    (the one that served last) and this thread on one CPU, the other worker on
    another.  Yields (beside, away); this thread's affinity is restored after."""
    mine, other = sorted(os.sched_getaffinity(0))[:2]
    saved = os.sched_getaffinity(0)
    wait_workers_ready(pool)
    for _ in range(50):
        assert pool.submit(noop).result(timeout=30) is None
    assert pool.stats()["prefetch"] > 1
    before = _served(pool)
    assert pool.submit(noop).result(timeout=30) is None
    (warm,) = [pid for pid, n in _served(pool).items() if n > before[pid]]
    (cold,) = [pid for pid in before if pid != warm]
    os.sched_setaffinity(warm, {mine})
    os.sched_setaffinity(cold, {other})
    _publish_cpu(pool, warm, mine)
    _publish_cpu(pool, cold, other)
    os.sched_setaffinity(0, {mine})  # this thread only
    try:
        yield warm, cold
    finally:
        os.sched_setaffinity(0, saved)


def test_a_short_task_goes_to_an_idle_worker_off_the_submitting_threads_cpu():
    with fastpool.Pool(2) as pool, _placed(pool) as (beside, away):
        before = _served(pool)
        for _ in range(ROUND_TRIPS):
            assert pool.submit(noop).result(timeout=30) is None
        after = _served(pool)
        assert pool.stats()["prefetch"] > 1
    assert after[beside] - before[beside] == 0
    assert after[away] - before[away] == ROUND_TRIPS


def test_a_task_never_queues_behind_a_busy_worker_while_the_one_beside_is_idle(tmp_path):
    """The preference is among idle workers only: behind a task that blocks, the next
    one would wait however short tasks have been."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    with fastpool.Pool(2) as pool, _placed(pool) as (beside, away):
        blocked = pool.submit(announce_then_gate, str(started), str(gate))
        try:
            wait_for(started.exists, what="the gated task to start")
            assert {w["pid"] for w in pool.stats()["workers"] if w["current_task"]} == {away}
            assert pool.submit(double, 21).result(timeout=30) == 42  # on the idle one, beside
        finally:
            gate.touch()
        assert blocked.result(timeout=30) == ""


def test_a_worker_whose_result_waits_uncollected_is_idle_for_the_next_task():
    """A submit settles what is ready before it places its task: a worker that finished
    but whose result nobody collected yet is idle, so the next short task goes to it
    rather than to the worker beside the caller."""
    with fastpool.Pool(2) as pool, _placed(pool) as (beside, away):
        (slot,) = [w["slot"] for w in pool.stats()["workers"] if w["pid"] == away]

        def finished() -> int:  # the worker's own count, bumped once its result is out
            return pool._board.slot_info(slot)[4]

        pool._board.want(1)  # the collector thread keeps off the rings: only submit collects
        try:
            before, done = _served(pool), finished()
            first = pool.submit(noop)
            wait_for(lambda: finished() > done, what="the first task's result to be published")
            second = pool.submit(double, 21)
            assert second.result(timeout=30) == 42 and first.result(timeout=30) is None
            after = _served(pool)
        finally:
            pool._board.want(-1)
    assert after[away] - before[away] == 2 and after[beside] == before[beside], (before, after)
