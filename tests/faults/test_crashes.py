"""Real damage to real workers: every failure ends in a specific error on its future."""

import concurrent.futures.process
import os
import signal
import threading
import time
import traceback
from concurrent.futures import CancelledError, wait

import _faulty
import _tasks
import psutil
import pytest
from _waiting import wait_for, wait_workers_ready

import fastpool
from fastpool import CircuitOpen, PoisonTask, TaskTimeout, WorkerCrashed, WorkerHung
from fastpool._supervision import _policy

pytestmark = pytest.mark.faults


@pytest.fixture
def pool():
    p = fastpool.Pool(2, backoff_base_s=0.01, hang_timeout=1.0)
    yield p
    p.shutdown(wait=True, cancel_futures=True)


def _busy_pid(pool, task_future, timeout=10):
    def busy():
        return next((w["pid"] for w in pool.stats()["workers"] if w["current_task"]), None)

    return wait_for(busy, timeout, "a worker to pick the task up")


@pytest.mark.parametrize(
    "die, exitcode",
    [
        (_faulty.segfault, -signal.SIGSEGV),
        (_faulty.sigkill_self, -signal.SIGKILL),
        (_faulty.hard_exit, 7),
    ],
)
def test_crash_fails_only_its_future(pool, die, exitcode):
    doomed, bystander = pool.submit(die), pool.submit(_tasks.double, 21)
    with pytest.raises(WorkerCrashed) as info:
        doomed.result(timeout=30)
    assert info.value.exitcode == exitcode
    assert info.value.task_id is not None and info.value.pid is not None
    assert bystander.result(timeout=30) == 42  # the pool heals; nothing else is lost
    assert [pool.submit(_tasks.double, i).result(timeout=30) for i in range(10)] == [
        2 * i for i in range(10)
    ]


def test_sigkill_from_outside_names_the_signal(pool):
    fut = pool.submit(_tasks.sleep_then, 1, 30)
    victim = _busy_pid(pool, fut)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerCrashed) as info:
        fut.result(timeout=30)
    assert info.value.pid == victim and info.value.signal_name == "SIGKILL"
    assert "SIGKILL" in str(info.value)
    assert pool.submit(_tasks.double, 4).result(timeout=30) == 8


@pytest.mark.parametrize(
    "die, args, how",
    [
        (_faulty.hard_exit, (99,), "with exit code 99"),
        (_faulty.sigkill_self, (), "with exit code -9 (SIGKILL)"),
    ],
)
def test_a_crash_says_how_the_process_ended_as_its_cause(pool, die, args, how):
    """As ProcessPoolExecutor from Python 3.15 on (gh-139462, CPython's
    test_traceback_when_child_process_terminates_abruptly): the cause is its own
    _RemoteTraceback class, whose text says how the process ended; here on every Python."""
    with pytest.raises(WorkerCrashed) as info:
        pool.submit(die, *args).result(timeout=30)
    cause = info.value.__cause__
    assert isinstance(cause, concurrent.futures.process._RemoteTraceback)
    assert f"Process {info.value.pid} (fastpool worker {info.value.worker_id}) " in cause.tb
    assert f"terminated abruptly {how}" in cause.tb
    assert cause.tb in "".join(traceback.format_exception(info.value))  # what a user reads


def test_worker_killed_while_idle_is_replaced_without_changing_capacity(pool):
    assert pool.submit(_tasks.double, 1).result(timeout=30) == 2
    wait_workers_ready(pool, 2)
    before = pool.pids()
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)

    def replaced():
        now = pool.pids()
        return now if before[0] not in now and len(now) == 2 else None

    after = wait_for(replaced, what="the killed worker to be replaced")
    assert len(after) == 2 and before[0] not in after and before[1] in after
    futs = [pool.submit(_tasks.sleep_then, i, 0.05) for i in range(8)]
    assert [f.result(timeout=30) for f in futs] == list(range(8))
    assert len(pool.pids()) == 2


def test_task_timeout_kills_and_replaces_the_worker(pool):
    fut = pool.options(timeout=0.5).submit(_faulty.spin_forever)
    t0 = time.monotonic()
    with pytest.raises(TaskTimeout) as info:
        fut.result(timeout=30)
    assert 0.4 < time.monotonic() - t0 < 15
    assert info.value.timeout_s == 0.5
    assert pool.submit(_tasks.double, 5).result(timeout=30) == 10
    assert pool.stats()["crashes"][-1]["cause"] == "timeout"


def test_timeouts_in_a_row_do_not_open_the_breaker():
    with fastpool.Pool(1, max_failures=3) as p:
        for _ in range(5):
            with pytest.raises(fastpool.TaskTimeout):
                p.options(timeout=0.1).submit(_tasks.sleep_then, 1, 30).result(timeout=30)
        assert p.submit(_tasks.double, 4).result(timeout=30) == 8  # no CircuitOpen
        assert p.stats()["workers"][0]["failures"] == 0


def test_pool_default_task_timeout():
    with fastpool.Pool(1, task_timeout=0.3, backoff_base_s=0.01) as p:
        with pytest.raises(TaskTimeout):
            p.submit(_tasks.sleep_then, 1, 30).result(timeout=30)
        assert p.submit(_tasks.double, 2).result(timeout=30) == 4


def test_sigstopped_worker_is_declared_hung(pool):
    fut = pool.submit(_faulty.sigstop_self)
    with pytest.raises(WorkerHung) as info:
        fut.result(timeout=30)
    assert "heartbeat" in str(info.value)
    assert pool.submit(_tasks.double, 3).result(timeout=30) == 6
    assert pool.stats()["crashes"][-1]["cause"] == "hung"


def test_long_python_task_keeps_beating_and_is_not_hung():
    with fastpool.Pool(1, hang_timeout=0.5) as p:
        assert p.submit(_tasks.sleep_then, "ok", 1.5).result(timeout=30) == "ok"
        assert p.stats()["crashed"] == 0


def _breaker_opened(pool) -> CircuitOpen:
    """Waits for the one worker's breaker to open; returns what a submit then raises."""
    wait_for(
        lambda: pool.stats()["workers"][0]["state"] == "open",
        what=lambda: f"the breaker: {pool.stats()}",
    )
    with pytest.raises(CircuitOpen) as info:
        pool.submit(_tasks.double, 1)
    return info.value


@pytest.mark.parametrize("init", [_faulty.bad_initializer, _faulty.exiting_initializer])
def test_broken_initializer_opens_the_breaker(init):
    proc = psutil.Process()
    cpu0 = sum(proc.cpu_times()[:2])
    p = fastpool.Pool(1, initializer=init, backoff_base_s=0.01, backoff_cap_s=0.05, max_failures=4)
    try:
        info = _breaker_opened(p)
        assert info.retry_after_s > 0
        assert "init" in str(info)
        # 4 starts in all; that no start follows while open is the next test's claim
        assert p.stats()["restarts"] == 3
    finally:
        p.shutdown()
    assert sum(proc.cpu_times()[:2]) - cpu0 < 5.0  # no crash loop burning a core


def test_a_crash_looping_initializer_is_started_max_failures_times_then_not_for_minutes(tmp_path):
    # With the default breaker a broken initializer costs DEFAULT_MAX_FAILURES starts,
    # then none for DEFAULT_OPEN_S: so at most that many in any first ten seconds,
    # however fast the backoff (full jitter may draw ~0 s; shrunk here to keep the
    # test short, which only makes a crash loop easier to see).
    log = tmp_path / "starts"
    p = fastpool.Pool(
        1,
        initializer=_faulty.counting_initializer,
        initargs=(str(log),),
        backoff_base_s=0.005,
        backoff_cap_s=0.01,
    )
    try:
        info = _breaker_opened(p)
        assert len(log.read_text().split()) == _policy.DEFAULT_MAX_FAILURES
        # the pool's own promise, not a measured time: no start before this much longer
        assert info.retry_after_s > 10.0
        assert p.stats()["workers"][0]["state"] == "open"
        assert len(log.read_text().split()) == _policy.DEFAULT_MAX_FAILURES
    finally:
        p.shutdown()


def test_queued_tasks_fail_with_circuit_open_and_inline_fallback_runs_them():
    p = fastpool.Pool(
        1,
        initializer=_faulty.bad_initializer,
        backoff_base_s=0.01,
        backoff_cap_s=0.02,
        max_failures=2,
    )
    try:
        queued = p.submit(_tasks.double, 1)
        inline = p.options(fallback="inline").submit(_tasks.double, 2)
        with pytest.raises(CircuitOpen):
            queued.result(timeout=30)
        assert inline.result(timeout=30) == 4
        assert p.options(fallback="inline").submit(os.getpid).result(timeout=5) == os.getpid()
        assert p.stats()["calls_inline"] >= 2
    finally:
        p.shutdown()


def test_pure_task_is_retried_once_on_a_fresh_worker(pool, tmp_path):
    fut = pool.options(pure=True).submit(_faulty.die_once, str(tmp_path / "marker"))
    assert fut.result(timeout=30) == "second try"
    assert pool.stats()["retried"] == 1


def test_task_that_kills_two_workers_is_poison(pool):
    fut = pool.options(pure=True).submit(_faulty.sigkill_self)
    with pytest.raises(PoisonTask) as info:
        fut.result(timeout=30)
    assert isinstance(info.value, WorkerCrashed)
    assert pool.stats()["crashed"] == 2
    assert pool.submit(_tasks.double, 1).result(timeout=30) == 2


def test_decorated_task_options_apply():
    timed = fastpool.task(timeout=0.3)(_faulty.spin_forever)
    with fastpool.Pool(1, backoff_base_s=0.01) as p:
        with pytest.raises(TaskTimeout):
            p.submit(timed).result(timeout=30)


def test_forced_cancel_kills_the_worker(pool):
    fut = pool.submit(_tasks.sleep_then, 1, 30)
    _busy_pid(pool, fut)
    assert pool.cancel(fut, force=True)
    with pytest.raises(CancelledError):
        fut.result(timeout=30)
    assert pool.submit(_tasks.double, 2).result(timeout=30) == 4
    assert pool.stats()["crashes"][-1]["cause"] == "cancelled"


def test_cooperative_cancel_sets_the_flag(pool):
    fut = pool.submit(_tasks.cooperative, 30)
    pid = _busy_pid(pool, fut)
    t0 = time.monotonic()
    assert pool.cancel(fut) is False  # asked, not stopped: the task reads the flag
    with pytest.raises(CancelledError):
        fut.result(timeout=30)
    assert time.monotonic() - t0 < 10
    assert pid in pool.pids()  # the worker was not killed
    assert pool.stats()["crashed"] == 0


def test_a_task_still_queued_in_the_parent_cancels_like_any_future(tmp_path):
    gate, ran = tmp_path / "open", tmp_path / "ran"
    with fastpool.Pool(1) as p:
        # Gated tasks until one waits in the parent's queue: the worker's prefetch is full.
        held = []
        while not p.stats()["queued"]:
            held.append(p.submit(_tasks.gate, str(gate), len(held)))
            assert len(held) < 1000, p.stats()
        queued = p.submit(_tasks.touch_then_sleep, str(ran), "ran", 0)
        assert queued.cancel() is True
        assert queued.cancelled()
        with pytest.raises(CancelledError):
            queued.result(timeout=0)
        gate.touch()
        assert [f.result(timeout=30)[0] for f in held] == list(range(len(held)))
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2  # after the cancelled one
        assert not ran.exists()  # it never ran


def test_crash_record_content(pool):
    import numpy as np

    arr = np.zeros((10, 3), dtype=np.float32)
    fut = pool.submit(_faulty.maybe_die, 0, 1)
    with pytest.raises(WorkerCrashed):
        fut.result(timeout=30)
    fut = pool.submit(_tasks.sleep_then, arr, 30)
    os.kill(_busy_pid(pool, fut), signal.SIGKILL)
    with pytest.raises(WorkerCrashed):
        fut.result(timeout=30)
    rec = pool.stats()["crashes"][-1]
    assert rec["cause"] == "died" and rec["signal"] == "SIGKILL" and rec["exitcode"] == -9
    assert rec["function"] == "sleep_then" and rec["task_id"] is not None
    assert "ndarray(10, 3) float32 120 B" in rec["args"]
    assert rec["worker_age_s"] >= 0 and "time" in rec and "tasks_served" in rec


def test_soak_five_percent_of_tasks_kill_their_worker():
    with fastpool.Pool(2, backoff_base_s=0.005, backoff_cap_s=0.02, max_failures=50) as p:
        futs = {i: p.submit(_faulty.maybe_die, i, 20) for i in range(1, 301)}
        done, not_done = wait(futs.values(), timeout=120)
        assert not not_done  # every future settles
        for i, f in futs.items():
            if i % 20 == 0:
                assert isinstance(f.exception(), WorkerCrashed)
            else:
                assert f.result() == i * i  # nothing lost, nothing wrong
        assert p.stats()["crashed"] == 15


def test_threads_submitting_while_workers_die():
    with fastpool.Pool(2, backoff_base_s=0.005, backoff_cap_s=0.02, max_failures=100) as p:
        results: dict[int, object] = {}

        def client(k):
            futs = [
                (k * 1000 + i, p.submit(_faulty.maybe_die, k * 1000 + i, 13)) for i in range(1, 60)
            ]
            for key, f in futs:
                try:
                    results[key] = f.result(timeout=120)
                except WorkerCrashed:
                    results[key] = "crashed"

        threads = [threading.Thread(target=client, args=(k,)) for k in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert len(results) == 4 * 59
        for key, v in results.items():
            assert v == ("crashed" if key % 13 == 0 else key * key)


def test_async_task_runs_to_completion_and_child_errors_come_back(pool):
    assert pool.submit(_tasks.async_task, 41).result(timeout=30) == 42
    with pytest.raises(KeyError, match="from a child task"):
        pool.submit(_tasks.async_failing_child).result(timeout=30)
