"""An idle pool sleeps, and supervision keeps its promises when work comes back.

Every wait here is on an event the pool exposes (the supervisor's select called with no
timeout, a worker's heartbeat thread asleep), never on a sleep: the claims are about
what wakes, not about how long anything takes.
"""

import _faulty
import _tasks
import pytest
from _waiting import spy_select, wait_for

import fastpool
from fastpool import WorkerHung

pytestmark = pytest.mark.faults


def test_an_idle_pools_supervisor_blocks_until_a_task_comes():
    with fastpool.Pool(2, hang_timeout=60.0) as p:
        sup = p._sup
        timeouts = spy_select(sup)
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        # nothing in flight: the thread ends its ticks and blocks with no timeout
        wait_for(lambda: None in timeouts, what=lambda: f"a blocking select: {timeouts[-5:]}")
        asleep = sup.wakeups
        woke = len(timeouts)
        # a task wakes it: it times the task again (ticks with a timeout)
        fut = p.submit(_tasks.sleep_then, 3, 0.5)
        wait_for(lambda: any(t is not None for t in timeouts[woke:]), what="the supervisor to wake")
        assert sup.wakeups > asleep
        assert fut.result(timeout=30) == 3


def test_an_idle_workers_heartbeat_sleeps_and_a_long_task_still_beats():
    with fastpool.Pool(1, hang_timeout=0.5) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        wait_for(lambda: p._board.beat_parked(0), what="the idle worker's heartbeat to sleep")
        before = p._board.slot_info(0)[3]
        # its next task wakes it: a 1.5 s task beats through it, and is not declared hung
        assert p.submit(_tasks.sleep_then, "ok", 1.5).result(timeout=30) == "ok"
        assert p._board.slot_info(0)[3] > before
        assert p.stats()["crashed"] == 0 and p.stats()["killed"] == 0


def test_an_idle_then_hung_worker_is_declared_hung():
    with fastpool.Pool(1, hang_timeout=0.5, backoff_base_s=0.01) as p:
        timeouts = spy_select(p._sup)
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        wait_for(lambda: p._board.beat_parked(0), what="the idle worker's heartbeat to sleep")
        wait_for(lambda: None in timeouts, what="the supervisor to sleep")
        with pytest.raises(WorkerHung) as info:
            p.submit(_faulty.sigstop_self).result(timeout=30)
        assert "heartbeat" in str(info.value)
        assert p.submit(_tasks.double, 3).result(timeout=30) == 6


def test_memory_limits_still_apply_after_the_pool_slept():
    with fastpool.Pool(1, memory_limit="300MiB", memory_interval_s=0.02) as p:
        timeouts = spy_select(p._sup)
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        wait_for(lambda: None in timeouts, what="the supervisor to sleep")
        with pytest.raises(fastpool.WorkerMemoryError) as info:
            p.submit(_faulty.allocate_mib, 600).result(timeout=60)
        assert info.value.reason == "memory-limit"
        assert p.submit(_tasks.double, 4).result(timeout=30) == 8


def _switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))


def test_a_caller_waiting_on_one_long_task_leaves_the_collector_asleep():
    # The caller drives the result rings itself; the collector used to look again every
    # 2 ms through the whole wait (~250 wake-ups here, ~10 ms of CPU a second that the
    # workers lose on a small machine).  Now it sleeps until that drive ends: one 50 ms
    # slice after another, each a wake-up, plus the few before it decides to.
    import threading

    with fastpool.Pool(1) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        collector = next(t for t in threading.enumerate() if t.name == "fastpool-collector")
        fut = p.submit(_tasks.sleep_then, 3, 0.5)
        before = _switches(collector.native_id)
        assert fut.result(timeout=30) == 3  # one drive of ~0.5 s
        woke = _switches(collector.native_id) - before
        assert woke < 60, f"the collector woke {woke} times during one 0.5 s wait"
        # and it takes over again once the caller stops: a callback's future settles
        done = threading.Event()
        p.submit(_tasks.double, 2).add_done_callback(lambda f: done.set())
        assert done.wait(30)


def test_a_drive_keeps_the_collector_away_in_one_wait_not_in_grace_slices():
    # While a caller drives, the collector used to look again every COLLECTOR_GRACE_S
    # until the drive was NAP_AFTER_S old: two or three wake-ups per result of a map of
    # long tasks, each one preempting a busy CPU.  It now waits out the rest of
    # NAP_AFTER_S at once: a grace-long wait while a drive runs happens only when that
    # rest was shorter than the grace, at most once per drive.
    from fastpool._runtime import _dispatch

    with fastpool.Pool(1) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        handoff, board = p._rt.handoff, p._board
        waits: list[tuple[float, bool]] = []
        real_wait = handoff.wait

        def wait(timeout=None):
            waits.append((timeout, board.wanted()))
            return real_wait(timeout)

        handoff.wait = wait
        try:
            drives = 4
            for i in range(drives):  # one drive each, of 0.2 s
                assert p.submit(_tasks.sleep_then, i, 0.2).result(timeout=30) == i
        finally:
            del handoff.wait
        grace_while_driven = [
            t for t, wanted in waits if wanted and t == _dispatch.COLLECTOR_GRACE_S
        ]
        assert len(grace_while_driven) <= drives, waits
        assert any(t == _dispatch.PARK_SLICE_S for t, _ in waits), "the collector never napped"


def test_a_busy_workers_beats_follow_hang_timeout():
    # Each beat takes the GIL from the task and wakes a thread on a busy CPU: a worker
    # beats a twentieth of hang_timeout apart (50 to 250 ms), not every 50 ms whatever
    # the timeout (50 beats in this 2.5 s task at the default 60 s, before).
    from fastpool._runtime._worker import beat_interval

    assert beat_interval(60.0) == 0.25 and beat_interval(None) == 0.25
    assert beat_interval(0.5) == 0.05 and beat_interval(4.0) == 0.2
    with fastpool.Pool(1) as p:  # hang_timeout=60
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        before = p._board.slot_info(0)[3]
        assert p.submit(_tasks.sleep_then, "ok", 2.5).result(timeout=30) == "ok"
        beats = p._board.slot_info(0)[3] - before
        assert 3 <= beats <= 15, f"{beats} beats in a 2.5 s task at hang_timeout=60"
        # and one beat that finds the worker idle puts the thread to sleep
        wait_for(lambda: p._board.beat_parked(0), what="the idle worker's heartbeat to sleep")
