"""The supervisor's decisions as functions of their facts, without processes:
a death's victim and fates (_deaths), and the kills of live workers (_watch)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from fastpool import errors
from fastpool._runtime._events import Fate
from fastpool._supervision import _deaths, _memory, _policy, _verdict, _watch
from fastpool._supervision._slot import Slot, stats_row
from fastpool._supervision._verdict import Cause, Kill


def task(tid: int, *, cancel: bool = False, timeout: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        id=tid,
        wire=tid << 3,
        fn_name="f",
        describe_args=lambda: "()",
        options=_policy.TaskOptions(timeout=timeout) if timeout else None,
        attempt=0,
        transferred=False,
        cancel_requested=cancel,
    )


def test_the_victim_is_the_task_the_board_names() -> None:
    tasks = [task(1), task(2)]
    assert _deaths.victim_of(tasks, 2 << 3, None, -9, False) is tasks[1]


def test_an_unasked_death_with_a_scribbled_current_word_hits_the_oldest_task() -> None:
    tasks = [task(1), task(2)]
    assert _deaths.victim_of(tasks, 12345, None, -signal.SIGSEGV, False) is tasks[0]


@pytest.mark.parametrize("exitcode", sorted(_deaths.EXITS_BETWEEN_TASKS))
def test_the_worker_loops_own_exits_between_tasks_hit_no_task(exitcode: int) -> None:
    assert _deaths.victim_of([task(1)], 0, None, exitcode, False) is None


def test_a_planned_stop_hits_no_task_the_board_does_not_name() -> None:
    assert _deaths.victim_of([task(1)], 0, Kill(Cause.STOPPED), None, False) is None
    assert _deaths.victim_of([task(1)], 0, None, -9, True) is None


def test_a_corrupting_worker_fails_every_task_it_held() -> None:
    fates = _deaths.corrupt_fates([task(1), task(2)], 0, 123, "bad ring")
    assert [f for _, f, _ in fates] == [Fate.FAIL, Fate.FAIL]
    assert all(isinstance(e, errors.SegmentCorrupt) and "bad ring" in str(e) for *_, e in fates)


def test_the_victims_fate_follows_cancel_then_the_verdict() -> None:
    death = _verdict.Death(slot=0, pid=1, exitcode=-9)
    facts = _deaths.task_facts(task(1))
    args = (death, Cause.CRASHED, "", facts)
    assert _deaths.victim_fate(task(1, cancel=True), *args, "retry")[1] is Fate.CANCEL
    assert _deaths.victim_fate(task(1), *args, "retry")[1] is Fate.RETRY
    _, fate, exc = _deaths.victim_fate(task(1), *args, "fail")
    assert fate is Fate.FAIL and isinstance(exc, errors.WorkerCrashed)


def test_death_facts_carry_the_memory_readings() -> None:
    mem = _memory.WorkerMemory(0, 1)
    mem.record(5 << 20, 0.0)
    death = _deaths.death_facts(
        slot=0,
        pid=1,
        exitcode=1,
        kill=None,
        starting=False,
        init_error=None,
        mem=mem,
        cg=None,
        oom_before=None,
        memory_limit=8 << 20,
        age_s=2.0,
        served=3,
    )
    assert death.memory == _verdict.MemoryFacts(8 << 20, 5 << 20, 5 << 20)
    assert (death.served, death.oom_confirmed) == (3, False)


def test_a_tasks_own_timeout_overrides_the_pools() -> None:
    assert _watch.task_limit(task(1, timeout=2.0), 10.0) == 2.0
    assert _watch.task_limit(task(1), 10.0) == 10.0
    assert _watch.task_limit(None, None) is None


def test_liveness_kills_for_the_timeout_first_then_the_heartbeat() -> None:
    kill = _watch.liveness_kill(10.0, 8, 0.0, 0.0, 5.0, 5.0)
    assert kill is not None and kill.cause is Cause.TIMEOUT and kill.wire == 8
    kill = _watch.liveness_kill(10.0, 8, 4.0, 2.0, 7.0, 5.0)
    assert kill is not None and kill.cause is Cause.HUNG
    assert _watch.liveness_kill(10.0, 8, 9.0, 9.0, 5.0, 5.0) is None


def test_a_heartbeat_is_missing_only_from_when_its_task_was_seen() -> None:
    # an idle worker's heartbeat thread sleeps: the last beat before the task says nothing
    assert _watch.liveness_kill(10.0, 8, 9.0, 0.0, None, 5.0) is None
    kill = _watch.liveness_kill(15.0, 8, 9.0, 0.0, None, 5.0)
    assert kill is not None and kill.cause is Cause.HUNG and "6.0 s" in kill.detail
    assert _watch.liveness_kill(10.0, 8, 0.0, 0.0, None, None) is None


def test_memory_kills_only_over_a_limit() -> None:
    assert not _watch.over_memory_limit(10, None)
    assert not _watch.over_memory_limit(10, 0)
    assert not _watch.over_memory_limit(10, 10)
    assert _watch.over_memory_limit(11, 10)
    kill = _watch.memory_kill(3 << 20, 2 << 20, 0)
    assert kill.cause is Cause.MEMORY and kill.wire is None and "3.0 MiB" in kill.detail


def test_a_busy_workers_memory_is_sampled_as_often_as_its_limit_needs() -> None:
    # the time to reach the limit at the growth bound, within the check's interval and
    # RELAXED_S; with no limit, RELAXED_S; a longer interval than RELAXED_S wins
    gib, relaxed = 1 << 30, _watch.RELAXED_S
    assert _watch.sample_pace(gib, None, 0.1) == relaxed
    assert _watch.sample_pace(gib, gib + (100 << 20), 0.1) == 0.1  # 100 MiB: 6 ms away
    assert _watch.sample_pace(gib, 3 * gib, 0.1) == 2 * gib / _watch.GROWTH_BPS
    assert _watch.sample_pace(gib, 64 * gib, 0.1) == relaxed
    assert _watch.sample_pace(2 * gib, gib, 0.1) == 0.1  # over it: at the next check
    assert _watch.sample_pace(gib, None, 5.0) == 5.0


def test_the_supervisor_ticks_at_least_as_often_as_memory_interval_s() -> None:
    from fastpool._supervision._supervisor import LIVENESS_TICK_S, QUIET_TICK_S, tick_s

    assert tick_s(None, 60.0, 0.1) == min(LIVENESS_TICK_S, 0.1)
    assert tick_s(None, 60.0, 0.02) == 0.02  # memory_interval_s below the liveness pace
    assert tick_s(None, None, 0.1) == 0.1  # no timeouts: memory alone sets the pace
    assert tick_s(None, None, 5.0) == QUIET_TICK_S
    assert tick_s(1.0, None, 5.0) == LIVENESS_TICK_S


def test_pressure_pauses_below_the_floor() -> None:
    assert _watch.paused_by_pressure(1, 2) and not _watch.paused_by_pressure(2, 2)


def test_a_stats_row_reports_a_dead_slot_by_its_breaker() -> None:
    slot = Slot(3, _policy.SlotBreaker())
    row = stats_row(slot, (0, 0, 0, 0, 0), (False, True, 4, 5), False, 1.0)
    assert row["slot"] == 3 and row["health"] == slot.breaker.state(1.0)
    assert (row["served"], row["assigned"], row["current_task"], row["retiring"]) == (
        4,
        5,
        None,
        False,
    )
