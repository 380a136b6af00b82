"""Memory: limits enforced by fastpool on what a worker owns, kernel OOM kills confirmed
from evidence (a real cgroup where root allows, a fake counter everywhere), recycling that
loses nothing, and dispatch paused under memory pressure.

The pool samples memory on its supervisor thread, one tick every ``memory_interval_s``
while a task is in flight (an idle pool sleeps), and samples only the workers whose
memory can have changed (busy, starting, or done with a task since their last sample).
Tests that need "the pool has looked since X" count ticks through ``monitor`` (a spy on
the supervisor's memory tick and on ``_memory``) instead of sleeping.
"""

import os
import select
import signal
import threading
import time
from pathlib import Path

import _arrays
import _faulty
import _tasks
import pytest
from _waiting import wait_for

import fastpool
from fastpool import WorkerCrashed, WorkerMemoryError
from fastpool._supervision import _memory, _memory_tick, _watch

pytestmark = pytest.mark.faults

MiB = 2**20


class Monitor:
    """What the pool's memory ticks did: samples taken and OOM counters read.

    ``hold`` (a lock every counter read takes) lets a test freeze the reads while it
    changes a fake counter and kills a worker, so the order is certain."""

    def __init__(self) -> None:
        self.samples = 0
        self.ticks = 0
        self.counter_reads: list[dict] = []
        self.hold = threading.Lock()

    def wait_ticks(self, n: int = 2) -> None:
        """Wait until ``n`` more memory ticks (samples of the busy workers, cgroup
        counters, limit and leak checks, memory pressure) have ended.  With n = 2 a
        whole tick ran after the call: ticks run one after another on one thread, and
        the first one counted may have begun before it.  Ticks run only while a task
        is in flight (or just was): an idle pool's supervisor sleeps."""
        start = self.ticks
        wait_for(lambda: self.ticks >= start + n, what=f"{n} memory ticks")

    def wait_counter_reads(self, n: int = 2) -> None:
        """Wait until the ticks read the OOM-kill counter ``n`` more times.  With n = 2
        a whole tick read it after the call (and set its baseline, if the worker lived
        through it): a tick can sample a worker and skip the counter (a sample that
        found no memory), so samples alone do not say the counter was read."""
        start = len(self.counter_reads)
        wait_for(lambda: len(self.counter_reads) >= start + n, what=f"{n} OOM counter reads")


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> Monitor:
    m = Monitor()
    real_sample, real_count = _memory.WorkerMemory.sample, _memory.oom_kill_count

    def sample(self, now, *more):
        out = real_sample(self, now, *more)
        m.samples += 1
        return out

    def count(cg):
        with m.hold:
            m.counter_reads.append(cg)
            return real_count(cg)

    real_tick = _memory_tick.MemoryTick.check

    def tick(self):
        try:
            return real_tick(self)
        finally:
            m.ticks += 1

    monkeypatch.setattr(_memory.WorkerMemory, "sample", sample)
    monkeypatch.setattr(_memory_tick.MemoryTick, "check", tick)
    monkeypatch.setattr(_memory, "oom_kill_count", count)
    return m


def _busy(pool, tmp_path: Path, seconds: float = 30):
    """A task that is surely running when this returns (it wrote its marker)."""
    started = tmp_path / "started"
    fut = pool.submit(_tasks.touch_then_sleep, str(started), 1, seconds)
    wait_for(started.exists, what="the task to start")
    return fut


def _kill_and_wait(pid: int) -> None:
    """SIGKILL ``pid`` and return once it has exited. Not our child (the template
    forked it), so through a pidfd, opened before the kill: after it the template
    may reap the pid at once."""
    fd = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        assert select.select([fd], [], [], 30)[0], f"worker {pid} did not die"
    finally:
        os.close(fd)


def test_task_over_memory_limit_is_killed_reported_and_replaced():
    with fastpool.Pool(1, memory_limit="300MiB", memory_interval_s=0.02, backoff_base_s=0.01) as p:
        fut = p.submit(_faulty.allocate_mib, 600)
        with pytest.raises(WorkerMemoryError) as info:
            fut.result(timeout=60)
        err = info.value
        assert err.reason == "memory-limit" and err.limit_bytes == 300 * 2**20
        assert err.rss_bytes > 300 * 2**20 and err.peak_rss_bytes >= err.rss_bytes
        assert err.task_id is not None and "over memory_limit 300.0 MiB" in str(err)
        assert p.submit(_tasks.double, 4).result(timeout=30) == 8  # replaced, pool goes on
        rec = p.stats()["crashes"][-1]
        assert rec["cause"] == "memory"


def test_a_worker_reading_a_shared_array_over_its_limit_is_not_killed_but_allocating_is():
    limit = 300 * MiB
    with fastpool.Pool(1, memory_limit=limit, memory_interval_s=0.02, backoff_base_s=0.01) as p:
        shared = p.zeros(600 * MiB // 8)  # in the arena: shared memory, twice the limit
        shared[:] = 1.0
        assert p.submit(_arrays.total, shared).result(timeout=60) == shared.size
        pid = p.pids()[0]
        mem = _memory.read_memory(pid)  # the pages the worker summed stay mapped in it
        assert mem is not None and mem.shmem_bytes is not None and mem.shmem_bytes > 550 * MiB
        assert mem.rss_bytes > limit  # plain RSS would have killed it
        wait_for(lambda: p.stats()["workers"][0]["rss_bytes"], what="a memory sample")
        assert p.submit(_arrays.total, shared).result(timeout=60) == shared.size  # again, sampled
        assert p.pids() == [pid] and p.stats()["crashed"] == 0
        assert p.stats()["workers"][0]["rss_bytes"] < limit  # the owned figure the limit compares

        with pytest.raises(WorkerMemoryError) as info:  # private memory still counts
            p.submit(_faulty.allocate_mib, 600).result(timeout=60)
        assert info.value.reason == "memory-limit" and info.value.pid == pid
        assert p.submit(_tasks.double, 4).result(timeout=30) == 8


def test_external_sigkill_is_not_reported_as_oom(monitor, tmp_path):
    with fastpool.Pool(1, backoff_base_s=0.01, memory_interval_s=0.02) as p:
        fut = _busy(p, tmp_path)
        monitor.wait_counter_reads()  # the cgroup counter was read while the worker lives
        os.kill(p.pids()[0], signal.SIGKILL)
        with pytest.raises(WorkerCrashed) as info:
            fut.result(timeout=30)
        assert not isinstance(info.value, WorkerMemoryError)
        rec = p.stats()["crashes"][-1]
        assert rec["cause"] == "died" and "not the OOM killer" in rec["evidence"]


def test_a_tick_reads_one_oom_counter_per_cgroup_not_per_worker(monitor, tmp_path):
    # Both workers live in this process's cgroup: one reading of its counter serves both
    # (each read is an open, a read and a parse of a cgroup file, every tick).
    with fastpool.Pool(2, memory_interval_s=0.02) as p:
        marks = [tmp_path / f"started{i}" for i in range(2)]
        futs = [p.submit(_tasks.touch_then_sleep, str(m), i, 30) for i, m in enumerate(marks)]
        try:
            wait_for(lambda: all(m.exists() for m in marks), what="both tasks to start")
            assert len(set(p.pids())) == 2
            monitor.wait_ticks()
            reads, ticks = len(monitor.counter_reads), monitor.ticks
            monitor.wait_ticks(6)
            read, ticked = len(monitor.counter_reads) - reads, monitor.ticks - ticks
            assert 1 <= read <= ticked + 1, f"{read} reads in {ticked} ticks"
        finally:
            p.kill_workers()  # the 30 s tasks fail with WorkerCrashed: not what is tested
        for fut in futs:
            with pytest.raises(WorkerCrashed):
                fut.result(timeout=30)


def test_a_busy_worker_far_from_any_limit_is_sampled_at_a_relaxed_pace(monitor, tmp_path):
    # No memory_limit: its own memory is read every RELAXED_S, not at every check, so a
    # check's cost does not grow with the workers (the OOM counter is read at every check).
    with fastpool.Pool(1, memory_interval_s=0.02) as p:
        fut = _busy(p, tmp_path)
        try:
            monitor.wait_ticks()
            samples, ticks, reads = monitor.samples, monitor.ticks, len(monitor.counter_reads)
            t0 = time.monotonic()
            monitor.wait_ticks(30)
            elapsed = time.monotonic() - t0
            sampled, ticked = monitor.samples - samples, monitor.ticks - ticks
            assert len(monitor.counter_reads) - reads >= ticked - 1
            assert sampled <= 1 + elapsed / _watch.RELAXED_S, (sampled, ticked, elapsed)
        finally:
            p.kill_workers()  # the 30 s task fails with WorkerCrashed: not what is tested
        with pytest.raises(WorkerCrashed):
            fut.result(timeout=30)


def test_a_busy_worker_near_its_memory_limit_is_sampled_at_every_check(monitor, tmp_path):
    # At _watch.GROWTH_BPS a worker covers 300 MiB within one 20 ms check: each check
    # samples it.
    with fastpool.Pool(1, memory_limit="300MiB", memory_interval_s=0.02) as p:
        fut = _busy(p, tmp_path)
        try:
            monitor.wait_ticks()
            samples, ticks = monitor.samples, monitor.ticks
            monitor.wait_ticks(10)
            sampled, ticked = monitor.samples - samples, monitor.ticks - ticks
            assert sampled >= ticked - 1, (sampled, ticked)
        finally:
            p.kill_workers()
        with pytest.raises(WorkerCrashed):
            fut.result(timeout=30)


EVENTS = "low 0\nhigh 0\nmax 0\noom 0\noom_kill {}\noom_group_kill 0\n"


@pytest.mark.parametrize("kills_after, cause", [(1, "oom-killer"), (0, "died")])
def test_the_oom_verdict_follows_the_cgroup_counter(
    monitor, monkeypatch, tmp_path, kills_after, cause
):
    # Runs everywhere, root or not: the worker's cgroup is a directory holding the
    # two files the kernel would, and the test plays the kernel: it raises
    # memory.events' oom_kill (or not) and sends the SIGKILL.
    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "memory.events").write_text(EVENTS.format(0))
    (cg / "memory.max").write_text(f"{300 * MiB}\n")
    monkeypatch.setattr(
        _memory, "cgroup_of", lambda pid="self", root="/": {"v2": cg, "v1_memory": None}
    )
    with fastpool.Pool(1, backoff_base_s=0.01, memory_interval_s=0.02) as p:
        fut = _busy(p, tmp_path)
        monitor.wait_counter_reads()  # "before" = 0, read while the worker lived
        pid = p.pids()[0]
        with monitor.hold:  # no counter read until the worker is dead and the counter final
            (cg / "memory.events").write_text(EVENTS.format(kills_after))
            _kill_and_wait(pid)
        with pytest.raises(WorkerCrashed) as info:
            fut.result(timeout=30)
        rec = p.stats()["crashes"][-1]
        assert rec["cause"] == cause
        if kills_after:
            assert isinstance(info.value, WorkerMemoryError) and info.value.reason == "oom-killer"
            assert info.value.limit_bytes == 300 * MiB  # the worker's cgroup limit, not the pool's
            assert "counter rose from 0 to 1" in rec["evidence"]
        else:
            assert not isinstance(info.value, WorkerMemoryError)
            assert "stayed at 0" in rec["evidence"] and "not the OOM killer" in rec["evidence"]
        assert p.submit(_tasks.double, 2).result(timeout=30) == 4


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
def test_real_kernel_oom_kill_is_confirmed_from_the_cgroup_counter(monitor, tmp_path):
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
            assert p.submit(_tasks.double, 1).result(timeout=30) == 2
            pid = p.pids()[0]
            (child / "cgroup.procs").write_text(str(pid))
            # the monitor samples busy workers only (an idle one's memory cannot change):
            # it follows this one into its new cgroup while a task holds it
            gate = tmp_path / "go"
            held = p.submit(_tasks.wait_for_file, str(gate))
            reads = len(monitor.counter_reads)
            wait_for(
                lambda: sum(child in c.values() for c in monitor.counter_reads[reads:]) >= 3,
                what=f"the monitor to read the counter of {child}",
            )
            gate.touch()
            assert held.result(timeout=30)
            fut = p.submit(_faulty.allocate_mib, 600)  # 3x the cgroup's limit
            with pytest.raises(WorkerMemoryError) as info:
                fut.result(timeout=60)
            assert info.value.reason == "oom-killer"
            assert info.value.exitcode == -signal.SIGKILL
            assert info.value.limit_bytes == limit
            rec = p.stats()["crashes"][-1]
            assert rec["cause"] == "oom-killer" and "counter rose" in rec["evidence"]
            assert p.submit(_tasks.double, 2).result(timeout=30) == 4
    finally:

        def removed() -> bool:
            try:
                child.rmdir()  # EBUSY until the killed worker has left the cgroup
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True

        wait_for(removed, 5, f"{child} to empty so it can be removed")


def test_recycling_by_task_count_loses_and_repeats_nothing():
    with fastpool.Pool(2, max_tasks_per_worker=5) as p:
        futs = [p.submit(_tasks.pid_and, i) for i in range(60)]
        results = [f.result(timeout=60) for f in futs]
        assert [r[1] for r in results] == list(range(60))  # each exactly once, in order
        per_pid: dict[int, int] = {}
        for worker_pid, _ in results:
            per_pid[worker_pid] = per_pid.get(worker_pid, 0) + 1
        assert max(per_pid.values()) <= 5 and len(per_pid) >= 12
        assert p.stats()["recycled"] >= 10
        assert p.stats()["crashed"] == 0


def test_recycling_by_leak_threshold_between_tasks(monitor):
    with fastpool.Pool(1, leak_threshold="100MiB", memory_interval_s=0.02) as p:
        first = p.submit(_faulty.leak_mib, 1).result(timeout=30)
        slot = p._sup.slots[0]
        wait_for(lambda: slot.baseline is not None, what="the baseline, after the first task")
        leaker = p.submit(_faulty.leak_mib, 200).result(timeout=30)
        assert leaker == first
        wait_for(lambda: p.stats()["recycled"] >= 1, 20, "the leaking worker to be recycled")
        assert p.stats()["recycled"] == 1 and p.stats()["crashed"] == 0
        assert p.submit(_tasks.pid).result(timeout=30) != first


def test_dispatch_pauses_under_memory_pressure_and_resumes(monitor):
    with fastpool.Pool(1, min_available_memory="1GiB", memory_interval_s=0.02) as p:
        # simulated: 100 MiB left, from before the first task, whose ticks (in flight, then
        # the supervisor's linger after it) read it: an idle pool reads nothing
        p._settings["available_memory"] = lambda: 100 * 2**20
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        wait_for(lambda: p.stats()["dispatch_paused"], 10, "dispatch to pause")
        fut = p.submit(_tasks.double, 21)
        monitor.wait_ticks()  # the pool looked again, and still holds it
        assert not fut.done() and p.stats()["queued"] == 1  # held back, not lost
        p._settings["available_memory"] = lambda: 8 * 2**30
        assert fut.result(timeout=30) == 42
        assert not p.stats()["dispatch_paused"] and p.stats()["paused"] == 1


def test_a_fractional_memory_floor_is_resolved_by_the_supervisor_not_the_constructor(
    monitor, monkeypatch
):
    from fastpool._supervision import _sizing

    readers: list[str] = []
    total = _sizing.total_memory_bytes

    def counted(*args, **kwargs):
        readers.append(threading.current_thread().name)
        return total(*args, **kwargs)

    monkeypatch.setattr(_sizing, "total_memory_bytes", counted)
    # all of memory as the floor: what is available is always less, so dispatch pauses
    with fastpool.Pool(1, min_available_memory=1.0, memory_interval_s=0.02) as p:
        assert readers == []  # the constructor left the fraction a fraction
        wait_for(lambda: p.stats()["dispatch_paused"], 10, "dispatch to pause")
        assert readers == ["fastpool-supervisor"]
        assert p._settings["min_available"] == total()  # resolved once, in bytes
        fut = p.submit(_tasks.double, 21)
        monitor.wait_ticks()
        assert not fut.done()  # held back by the resolved floor
        p._settings["available_memory"] = lambda: 2 * total()
        assert fut.result(timeout=30) == 42
        assert readers == ["fastpool-supervisor"]


def test_a_pool_that_reports_dispatch_paused_has_paused_it(monitor):
    # The supervisor tells of the pause (stats, its warning) only once the dispatcher
    # holds tasks back.  It used to tell first: a submit between the two (the suite at
    # load 1-4, here from inside the warning) was dispatched under pressure.
    import logging

    held: list = []

    class SubmitOnPause(logging.Handler):
        def emit(self, record):
            if "dispatch paused" in record.getMessage() and not held:
                held.append((p.stats()["dispatch_paused"], p.submit(_tasks.double, 21)))

    handler = SubmitOnPause(logging.WARNING)
    logging.getLogger("fastpool").addHandler(handler)
    try:
        with fastpool.Pool(2, min_available_memory="1GiB", memory_interval_s=0.02) as p:
            assert p.submit(_tasks.double, 1).result(timeout=30) == 2
            fut = p.submit(_tasks.sleep_then, 0, 30)  # in flight: the pool keeps looking
            p._settings["available_memory"] = lambda: 100 * 2**20
            wait_for(lambda: held, 10, "the pause to be told")
            reported, queued = held[0]
            assert reported
            monitor.wait_ticks()
            assert not queued.done() and p.stats()["queued"] == 1  # held back, not dispatched
            p._settings["available_memory"] = lambda: 8 * 2**30
            assert queued.result(timeout=30) == 42
            p.cancel(fut, force=True)
    finally:
        logging.getLogger("fastpool").removeHandler(handler)


def test_workers_auto_respects_the_memory_budget():
    from fastpool._supervision import _sizing

    budget = _sizing.total_memory_bytes() // 2 + 1  # room for one worker only
    with fastpool.Pool("auto", memory_limit=budget) as p:
        assert p.workers == 1


def test_stats_report_current_and_peak_memory():
    with fastpool.Pool(1, memory_interval_s=0.02) as p:
        p.submit(_tasks.double, 1).result(timeout=30)
        w = wait_for(
            lambda: (w := p.stats()["workers"][0])["rss_bytes"] and w, what="a memory sample"
        )
        assert w["rss_bytes"] > 10 * 2**20 and w["peak_rss_bytes"] >= w["rss_bytes"]
