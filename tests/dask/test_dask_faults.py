"""Real damage on a real LocalCluster: SIGKILLed children and Dask workers, a task that
spins past its timeout, one over its memory limit, a poison task, a nanny's memory kill.
Each failure ends in fastpool's own exception on the affected future, and nothing else
is lost."""

from __future__ import annotations

import os
import signal

import _faulty
import _tasks
import psutil
import pytest
from _waiting import wait_for

distributed = pytest.importorskip(
    "distributed", reason="the Dask tests need the dask extra: pip install -e '.[dask]'"
)

import _dask_tasks as tasks  # noqa: E402
import dask  # noqa: E402
from _dask_support import TAG_VAR, tagged_processes, worker_addresses  # noqa: E402

import fastpool.dask as fpd  # noqa: E402
from fastpool.errors import PoisonTask, TaskTimeout, WorkerCrashed, WorkerMemoryError  # noqa: E402

pytestmark = [pytest.mark.dask, pytest.mark.faults]

# The bound for a 1 s task timeout to reach the client, counted from the
# moment the task signalled that it runs: the pool checks limits every 0.1 s.
TIMEOUT_REPORTED_WITHIN_S = 2.0


def _worker_pids(client) -> dict[str, int]:
    return client.run(lambda: os.getpid())


def test_a_sigkilled_child_fails_one_task_and_the_dask_worker_lives_on(executor, dask_client):
    addr = worker_addresses(dask_client)[0]
    before = _worker_pids(dask_client)[addr]
    with dask.annotate(workers=[addr]):
        doomed = executor.submit(_faulty.sigkill_self)
        exc = doomed.exception(timeout=60)
        assert type(exc) is WorkerCrashed and exc.signal_name == "SIGKILL"
        assert isinstance(exc.__cause__, fpd.DaskRemoteTraceback)
        after_task = executor.submit(tasks.where).result(timeout=60)
    assert _worker_pids(dask_client)[addr] == before  # the Dask worker was not touched
    assert after_task["dask_worker"] == before


def test_a_spinning_task_times_out_and_the_other_workers_tasks_are_untouched(
    executor, dask_client, fifo
):
    spin_addr, other_addr = worker_addresses(dask_client)
    with dask.annotate(workers=[other_addr]):
        other_child = executor.submit(tasks.where).result(timeout=60)["pid"]
    crashed_before = executor.stats()["workers"][other_addr]["crashed"]
    started = fifo("spin-started")
    with dask.annotate(workers=[spin_addr]):
        spin = executor.options(timeout=1).submit(tasks.spin_after_signal, started.path)
    with dask.annotate(workers=[other_addr]):
        others = [executor.submit(tasks.where) for _ in range(5)]
    assert started.wait(60), "the spinning task never started"
    exc = spin.exception(timeout=TIMEOUT_REPORTED_WITHIN_S)
    assert isinstance(exc, TaskTimeout) and exc.timeout_s == 1
    assert {f.result(timeout=60)["pid"] for f in others} == {other_child}  # same child, alive
    assert executor.stats()["workers"][other_addr]["crashed"] == crashed_before


def test_a_task_over_memory_limit_fails_with_worker_memory_error(dask_client):
    ex = fpd.Executor(
        dask_client, name="fastpool-mem", memory_limit="256MiB", memory_interval_s=0.05
    )
    try:
        exc = ex.submit(tasks.hog_memory, 2 << 30).exception(timeout=60)
        assert isinstance(exc, WorkerMemoryError) and exc.reason == "memory-limit"
        assert exc.limit_bytes == 256 << 20
        assert ex.submit(_tasks.double, 2).result(timeout=60) == 4  # the pool replaced its child
    finally:
        ex.shutdown()
        dask_client.unregister_worker_plugin("fastpool-mem")


def test_a_pure_task_is_retried_once_after_a_crash_then_poison(executor, tmp_path):
    log = tmp_path / "attempts"
    exc = (
        executor.options(pure=True)
        .submit(tasks.note_pid_then_sigkill, str(log))
        .exception(timeout=60)
    )
    assert type(exc) is PoisonTask
    attempts = log.read_text().split()
    assert len(attempts) == 2 and attempts[0] != attempts[1]  # two children, one retry


def test_a_task_that_is_not_pure_is_not_retried(executor, tmp_path):
    log = tmp_path / "attempts"
    exc = executor.submit(tasks.note_pid_then_sigkill, str(log)).exception(timeout=60)
    assert type(exc) is WorkerCrashed
    assert len(log.read_text().split()) == 1


def test_a_sigkilled_dask_worker_leaves_no_fastpool_process_and_its_replacement_gets_a_pool(
    executor, dask_client, cluster_tag
):
    # Both pools serve one task first, so their children exist before the kill.
    for addr in worker_addresses(dask_client):
        with dask.annotate(workers=[addr]):
            executor.submit(_tasks.double, 1).result(timeout=60)
    victim_addr = worker_addresses(dask_client)[0]
    victim = dask_client.run(tasks.fastpool_pids, "fastpool", workers=[victim_addr])[victim_addr]
    assert victim["children"], "the victim's pool has no child to orphan"
    doomed = [psutil.Process(p) for p in [victim["template"], *victim["children"]]]
    assert all(p.environ().get(TAG_VAR) == cluster_tag for p in doomed)

    os.kill(victim["worker"], signal.SIGKILL)
    _gone, alive = psutil.wait_procs(doomed, timeout=10)
    assert not alive, f"fastpool processes outlived their Dask worker: {alive}"

    wait_for(
        lambda: (
            len(worker_addresses(dask_client)) == 2
            and victim_addr not in worker_addresses(dask_client)
        ),
        60,
        "the nanny to restart the killed worker",
    )
    # The plugin ran again on the new worker (a task reaches a worker only after its
    # plugins are set up): tasks there run in a fresh pool under a new template.
    seen = {}
    for addr in worker_addresses(dask_client):
        with dask.annotate(workers=[addr]):
            seen[addr] = executor.submit(tasks.where).result(timeout=60)
    pids = dask_client.run(tasks.fastpool_pids, "fastpool")
    for addr, where in seen.items():
        assert where["dask_worker"] == pids[addr]["worker"] != victim["worker"]
        assert where["template"] == pids[addr]["template"] != victim["template"]
    assert not {p.pid for p in tagged_processes(cluster_tag)} & {d.pid for d in doomed}


@pytest.mark.slow
def test_a_dead_dask_worker_is_reported_as_worker_memory_error_only_after_a_nanny_memory_kill():
    # Its own one-worker cluster with a small memory budget.  allowed-failures=0, so the
    # scheduler gives up after the first death instead of killing four workers.
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit="400MiB",
        ) as cluster,
        Client(cluster) as client,
    ):
        ex = fpd.Executor(client)
        # The child is fine; the 600 MiB result lands in the Dask worker, which the
        # nanny restarts at 95% of its budget.
        exc = ex.submit(tasks.big_result, 600 << 20).exception(timeout=60)
        assert isinstance(exc, fpd.DaskWorkerMemoryError) and isinstance(exc, WorkerMemoryError)
        assert exc.reason == "dask-nanny" and exc.rss_bytes > 300 << 20
        assert type(exc.__cause__).__name__ == "KilledWorker"
        # A worker SIGKILLed without a memory event is a plain DaskWorkerCrashed.
        exc = ex.submit(tasks.sigkill_dask_worker).exception(timeout=60)
        assert type(exc) is fpd.DaskWorkerCrashed and type(exc.__cause__).__name__ == "KilledWorker"
        ex.shutdown()
