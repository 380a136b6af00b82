"""fastpool.dask.Executor on a real LocalCluster: the Executor contract, lazy windowed
map, futures that stdlib and asyncio accept, work spread over both Dask workers."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools

import _tasks
import pytest

distributed = pytest.importorskip(
    "distributed", reason="the Dask tests need the dask extra: pip install -e '.[dask]'"
)

import _dask_tasks as tasks  # noqa: E402 - needs the sys.path entry conftest adds
import dask  # noqa: E402
from _waiting import running, wait_for  # noqa: E402

import fastpool  # noqa: E402
import fastpool.dask as fpd  # noqa: E402
from fastpool.errors import PoolClosed  # noqa: E402

pytestmark = pytest.mark.dask


def test_round_trip(executor):
    fut = executor.submit(_tasks.double, 21)
    assert isinstance(fut, cf.Future)
    assert fut.result(timeout=30) == 42


def test_a_tasks_exception_arrives_as_itself_with_the_remote_traceback(executor):
    fut = executor.submit(_tasks.raise_value_error, "no good")
    exc = fut.exception(timeout=30)
    assert type(exc) is ValueError and str(exc) == "no good"
    cause = exc.__cause__
    assert isinstance(cause, fpd.DaskRemoteTraceback)
    # the child's frame (the function that raised) and the Dask worker's address
    assert "raise_value_error" in cause.text and cause.worker.startswith("tcp://")


def test_tasks_run_in_fastpool_children_not_in_the_dask_worker(executor, dask_client):
    dask_worker_pids = set(dask_client.run(lambda: __import__("os").getpid()).values())
    seen = [executor.submit(tasks.where).result(timeout=30) for _ in range(4)]
    for w in seen:
        assert w["pid"] not in dask_worker_pids
        assert w["dask_worker"] in dask_worker_pids  # child <- template <- Dask worker


def test_dask_workers_are_daemonic_and_their_pools_still_start(executor, dask_client):
    # multiprocessing refuses children in daemonic processes; fastpool's template is
    # started with subprocess, so the pool in each (daemonic) worker runs anyway.
    assert set(dask_client.run(tasks.is_daemon).values()) == {True}
    pids = dask_client.run(tasks.fastpool_pids, "fastpool")
    assert all(p["template"] not in (None, p["worker"]) for p in pids.values())


def test_map_is_lazy_and_never_queues_more_than_its_window(dask_client):
    ex = fpd.Executor(dask_client, install=False, window=4)
    pulled = itertools.count()
    taken = [0]

    def items():
        for i in range(100_000):
            taken[0] = next(pulled) + 1
            yield i

    chunk = 1000
    out = []
    for i, r in enumerate(ex.map(_tasks.double, items(), chunksize=chunk)):
        # ahead of the consumer by at most the window's chunks (plus the one yielding now)
        assert taken[0] - i <= (4 + 1) * chunk
        out.append(r)
    assert out == [2 * i for i in range(100_000)]
    assert ex.stats()["map_window_max"] <= 4
    ex.shutdown()


def test_map_buffersize_bounds_the_chunks_in_flight_as_python_3_14_does(executor, dask_client):
    ex = fpd.Executor(dask_client, install=False)  # fresh counts; the plugin is the fixture's
    got = list(ex.map(_tasks.double, range(200), chunksize=10, buffersize=2))
    assert got == [2 * i for i in range(200)]
    assert ex.stats()["map_window_max"] <= 2
    with pytest.raises(TypeError, match="buffersize must be"):
        ex.map(_tasks.double, range(4), buffersize="2")
    with pytest.raises(ValueError, match="buffersize must be"):
        ex.imap_unordered(_tasks.double, range(4), buffersize=0)
    ex.shutdown()


def test_map_adapts_its_chunks_to_an_input_without_length(executor):
    assert list(executor.map(_tasks.double, (i for i in range(5000)))) == [
        2 * i for i in range(5000)
    ]


def test_map_yields_results_before_the_failing_item_then_raises(executor):
    it = executor.map(tasks.fail_on, range(50), [37] * 50, chunksize=8)
    got = []
    with pytest.raises(ValueError, match="item 37 is bad") as info:
        for r in it:
            got.append(r)
    assert got == list(range(37))
    assert "fail_on" in info.value.__cause__.text


def test_a_map_timeout_raises_and_cancels_the_chunk_it_waited_for(executor, fifo):
    started, go = fifo("started"), fifo("go")
    cancelled = executor.stats()["cancelled"]
    it = executor.map(tasks.block_until, [started.path], [go.path], timeout=1)
    assert started.wait(30)
    with pytest.raises(cf.TimeoutError):
        next(it)
    assert executor.stats()["cancelled"] == cancelled + 1
    with open(go.path, "wb") as f:  # let the child go; its result is dropped
        f.write(b"1")


def test_imap_unordered_returns_every_result(executor):
    assert sorted(executor.imap_unordered(_tasks.double, range(1000), chunksize=50)) == [
        2 * i for i in range(1000)
    ]


def test_work_reaches_both_dask_workers(dask_client):
    ex = fpd.Executor(dask_client, install=False)
    before = {a: s["plugin"]["calls"] for a, s in ex.stats()["workers"].items()}
    # 40 chunks of ~20 ms: enough for the scheduler to keep both workers busy
    assert sum(ex.map(tasks.sleep_s, [0.02] * 40, chunksize=1)) == pytest.approx(0.8)
    after = {a: s["plugin"]["calls"] for a, s in ex.stats()["workers"].items()}
    assert len(after) == 2 and all(after[a] > before.get(a, 0) for a in after)
    ex.shutdown()


def test_futures_work_with_as_completed_wait_and_asyncio(executor):
    futs = [executor.submit(_tasks.double, i) for i in range(10)]
    assert sorted(f.result() for f in cf.as_completed(futs, timeout=30)) == [
        2 * i for i in range(10)
    ]
    done, not_done = cf.wait([executor.submit(_tasks.double, 1)], timeout=30)
    assert len(done) == 1 and not not_done

    async def main():
        return await asyncio.wrap_future(executor.submit(_tasks.double, 5))

    assert asyncio.run(main()) == 10


def test_calls_are_never_merged_even_when_equal(executor):
    futs = [executor.submit(tasks.where) for _ in range(2)]
    assert futs[0]._dfut.key != futs[1]._dfut.key  # pure=False: a fresh key per call
    assert all(f.result(timeout=30)["pid"] for f in futs)


def test_task_options_travel_to_the_pool(executor):
    # @fastpool.task options ride on the function itself, through Dask and into the pool
    limited = fastpool.task(timeout=30)(_tasks.double)
    assert executor.submit(limited, 4).result(timeout=30) == 8


def test_a_callers_annotations_cannot_send_the_task_body_into_a_pool(executor):
    with dask.annotate(executor="fastpool", retries=5):
        assert executor.submit(_tasks.double, 3).result(timeout=30) == 6


def test_shutdown_cancels_queued_calls_and_lets_running_ones_finish(dask_client, fifo):
    ex = fpd.Executor(dask_client, install=False)
    started = [fifo(f"started{i}") for i in range(2)]
    go = [fifo(f"go{i}") for i in range(2)]
    workers = sorted(dask_client.scheduler_info()["workers"])
    running = []
    for i, addr in enumerate(workers):
        with dask.annotate(workers=[addr]):
            running.append(ex.submit(tasks.block_until, started[i].path, go[i].path))
    assert all(s.wait(30) for s in started), "the blocking tasks never started"
    queued = [ex.submit(_tasks.double, i) for i in range(6)]
    ex.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(PoolClosed):
        ex.submit(_tasks.double, 1)
    assert all(f.cancelled() for f in queued)
    for g in go:
        with open(g.path, "wb") as f:
            f.write(b"1")
    assert all(isinstance(f.result(timeout=30), int) for f in running)
    ex.shutdown(wait=True)


def test_cancelling_a_future_cancels_its_dask_task(executor, dask_client, fifo):
    started, go = fifo("started"), fifo("go")
    addr = sorted(dask_client.scheduler_info()["workers"])[0]
    with dask.annotate(workers=[addr]):
        blocker = executor.submit(tasks.block_until, started.path, go.path)
        assert started.wait(30)
        queued = executor.submit(_tasks.double, 1)
    assert queued.cancel() and queued.cancelled()
    # The cancel reaches Dask asynchronously: the blocker is released only once Dask
    # has it, or the queued task could start (and finish) before the cancel lands.
    wait_for(
        lambda: queued._dfut.status == "cancelled",
        what=lambda: f"Dask to cancel the queued task ({queued._dfut.status})",
    )
    with open(go.path, "wb") as f:
        f.write(b"1")
    assert blocker.result(timeout=30) > 0
    with pytest.raises(distributed.utils.CancelledError):
        distributed.wait([queued._dfut], timeout=30)
    assert queued._dfut.cancelled()  # the Dask task was cancelled too, not left to run


def test_cancelling_a_running_call_stops_it_in_its_child(executor, dask_client, fifo):
    """cancel() returns True for a call that already runs (the client cannot tell), so
    the call must really stop: its child is killed and replaced, it never returns."""
    started, go = fifo("started"), fifo("go")
    fut = executor.submit(tasks.block_until, started.path, go.path)
    assert started.wait(30)
    before = {
        p for d in dask_client.run(tasks.fastpool_pids, "fastpool").values() for p in d["children"]
    }
    assert fut.cancel() and fut.cancelled()
    wait_for(
        lambda: any(not running(p) for p in before), what="the child running the call to be killed"
    )


def test_bad_input_gets_clear_errors(executor, dask_client):
    with pytest.raises(TypeError, match="Pool does not take"):
        fpd.Executor(dask_client, name="typo", wrokers=2)
    with pytest.raises(TypeError, match="distributed.Client"):
        fpd.Executor(object())
    with pytest.raises(ValueError, match="timeout"):
        executor.options(timeout=-1)
    with pytest.raises(ValueError, match="fallback"):
        executor.options(fallback="elsewhere")
    with pytest.raises(TypeError, match="NumPy array"):
        executor.scatter([1, 2, 3])
    with pytest.raises(ValueError, match="chunksize"):
        executor.map(_tasks.double, range(3), chunksize=0)


def test_a_plugin_with_other_settings_or_none_at_all_is_an_error_not_a_surprise(
    executor, dask_client
):
    # Dask silently keeps the first plugin of a name (it is idempotent): say so instead
    with pytest.raises(ValueError, match="other settings"):
        fpd.Executor(dask_client, task_timeout=3)
    with pytest.raises(ValueError, match="no FastpoolPlugin named 'absent'"):
        fpd.Executor(dask_client, name="absent", install=False)


def test_shutdown_from_a_done_callback_does_not_wait_on_itself(dask_client):
    ex = fpd.Executor(dask_client, install=False)
    called = []
    fut = ex.submit(_tasks.double, 2)
    fut.add_done_callback(lambda f: (ex.shutdown(wait=True), called.append(f.result())))
    assert fut.result(timeout=30) == 4
    ex._settler.join(30)  # the settler runs the callback, then exits: nothing is outstanding
    assert called == [4] and not ex._settler.is_alive()


def test_stats_report_each_workers_pool(executor):
    executor.submit(_tasks.double, 1).result(timeout=30)
    st = executor.stats()
    assert st["submitted"] >= 1 and st["completed"] >= 1
    assert len(st["workers"]) == 2
    for pool_stats in st["workers"].values():
        assert len(pool_stats["workers"]) == 1  # threads_per_worker=1 -> one child each
        assert "plugin" in pool_stats


def test_plain_dask_tasks_can_be_routed_into_the_pool_by_annotation(executor, dask_client):
    dask_worker_pids = set(dask_client.run(lambda: __import__("os").getpid()).values())
    with dask.annotate(executor="fastpool"):
        fut = dask_client.submit(tasks.where, pure=False)
    assert fut.result(timeout=60)["pid"] not in dask_worker_pids
