"""Memory: limits enforced by fastpool, real kernel OOM kills confirmed from evidence,
recycling that loses nothing, and dispatch paused under memory pressure."""

import os
import signal
import time
from pathlib import Path

import pytest

import _faulty
import fastpool
from fastpool import WorkerCrashed, WorkerMemoryError, _memory

pytestmark = pytest.mark.faults


def test_task_over_memory_limit_is_killed_reported_and_replaced():
    with fastpool.Pool(1, memory_limit="300MiB", memory_interval_s=0.02, backoff_base_s=0.01) as p:
        fut = p.submit(_faulty.allocate_mib, 600)
        with pytest.raises(WorkerMemoryError) as info:
            fut.result(timeout=60)
        err = info.value
        assert err.reason == "memory-limit" and err.limit_bytes == 300 * 2**20
        assert err.rss_bytes > 300 * 2**20 and err.peak_rss_bytes >= err.rss_bytes
        assert err.task_id is not None and "over memory_limit 300.0 MiB" in str(err)
        assert p.submit(_faulty.double, 4).result(timeout=30) == 8  # replaced, pool goes on
        rec = p.stats()["crashes"][-1]
        assert rec["cause"] == "memory"


def test_external_sigkill_is_not_reported_as_oom():
    with fastpool.Pool(1, backoff_base_s=0.01, memory_interval_s=0.02) as p:
        fut = p.submit(_faulty.sleep_then, 1, 30)
        end = time.monotonic() + 10
        while time.monotonic() < end and not p.stats()["workers"][0]["current_task"]:
            time.sleep(0.01)
        time.sleep(0.1)  # let the monitor read the cgroup counter while the worker lives
        os.kill(p.pids()[0], signal.SIGKILL)
        with pytest.raises(WorkerCrashed) as info:
            fut.result(timeout=30)
        assert not isinstance(info.value, WorkerMemoryError)
        rec = p.stats()["crashes"][-1]
        assert rec["cause"] == "died" and "not the OOM killer" in rec["evidence"]


def _my_memory_cgroup() -> tuple[Path | None, bool]:
    """(this process's memory cgroup, is it v2).  On a hybrid host the v2 tree may
    lack the memory controller: use the one that has the limit file."""
    cg = _memory.cgroup_of("self")
    if cg.get("v2") is not None and (cg["v2"] / "memory.max").exists():
        return cg["v2"], True
    if cg.get("v1_memory") is not None and (cg["v1_memory"] / "memory.limit_in_bytes").exists():
        return cg["v1_memory"], False
    return None, False


@pytest.mark.linux
@pytest.mark.slow
def test_real_kernel_oom_kill_is_confirmed_from_the_cgroup_counter():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a memory cgroup")
    parent, v2 = _my_memory_cgroup()
    if parent is None:
        pytest.skip("no memory cgroup (v1 memory controller or v2) is mounted")
    child = parent / f"fastpool-oom-test-{os.getpid()}"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a child memory cgroup under {parent}: {exc}")
    try:
        limit = 200 * 2**20
        try:
            (child / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
            if (child / "memory.swap.max").exists():
                (child / "memory.swap.max").write_text("0")
        except OSError as exc:
            pytest.skip(f"cannot set a memory limit on {child}: {exc}")
        with fastpool.Pool(1, backoff_base_s=0.01, memory_interval_s=0.02) as p:
            assert p.submit(_faulty.double, 1).result(timeout=30) == 2
            pid = p.pids()[0]
            (child / "cgroup.procs").write_text(str(pid))
            time.sleep(0.3)  # the monitor follows the worker into its new cgroup
            fut = p.submit(_faulty.allocate_mib, 600)  # 3x the cgroup's limit
            with pytest.raises(WorkerMemoryError) as info:
                fut.result(timeout=60)
            assert info.value.reason == "oom-killer"
            assert info.value.exitcode == -signal.SIGKILL
            assert info.value.limit_bytes == limit
            rec = p.stats()["crashes"][-1]
            assert rec["cause"] == "oom-killer" and "counter rose" in rec["evidence"]
            assert p.submit(_faulty.double, 2).result(timeout=30) == 4
    finally:
        for _ in range(100):
            try:
                child.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_recycling_by_task_count_loses_and_repeats_nothing():
    with fastpool.Pool(2, max_tasks_per_worker=5) as p:
        futs = [p.submit(_faulty.pid_and, i) for i in range(60)]
        results = [f.result(timeout=60) for f in futs]
        assert [r[1] for r in results] == list(range(60))  # each exactly once, in order
        per_pid: dict[int, int] = {}
        for worker_pid, _ in results:
            per_pid[worker_pid] = per_pid.get(worker_pid, 0) + 1
        assert max(per_pid.values()) <= 5 and len(per_pid) >= 12
        assert p.stats()["recycled"] >= 10
        assert p.stats()["crashed"] == 0


def test_recycling_by_leak_threshold_between_tasks():
    with fastpool.Pool(1, leak_threshold="100MiB", memory_interval_s=0.02) as p:
        first = p.submit(_faulty.leak_mib, 1).result(timeout=30)
        time.sleep(0.2)  # baseline taken after the first task
        leaker = p.submit(_faulty.leak_mib, 200).result(timeout=30)
        assert leaker == first
        end = time.monotonic() + 20
        while time.monotonic() < end and p.stats()["recycled"] < 1:
            time.sleep(0.02)
        assert p.stats()["recycled"] == 1 and p.stats()["crashed"] == 0
        assert p.submit(_faulty.pid).result(timeout=30) != first


def test_dispatch_pauses_under_memory_pressure_and_resumes():
    with fastpool.Pool(1, min_available_memory="1GiB", memory_interval_s=0.02) as p:
        assert p.submit(_faulty.double, 1).result(timeout=30) == 2
        p._settings["available_memory"] = lambda: 100 * 2**20  # simulated: 100 MiB left
        end = time.monotonic() + 10
        while time.monotonic() < end and not p.stats()["dispatch_paused"]:
            time.sleep(0.01)
        assert p.stats()["dispatch_paused"]
        fut = p.submit(_faulty.double, 21)
        time.sleep(0.3)
        assert not fut.done()  # held back, not lost
        p._settings["available_memory"] = lambda: 8 * 2**30
        assert fut.result(timeout=30) == 42
        assert not p.stats()["dispatch_paused"] and p.stats()["paused"] == 1


def test_workers_auto_respects_the_memory_budget():
    from fastpool import _sizing

    budget = _sizing.total_memory_bytes() // 2 + 1  # room for one worker only
    with fastpool.Pool("auto", memory_limit=budget) as p:
        assert p.workers == 1


def test_stats_report_current_and_peak_rss():
    with fastpool.Pool(1, memory_interval_s=0.02) as p:
        p.submit(_faulty.double, 1).result(timeout=30)
        time.sleep(0.2)
        w = p.stats()["workers"][0]
        assert w["rss_bytes"] > 10 * 2**20 and w["peak_rss_bytes"] >= w["rss_bytes"]
