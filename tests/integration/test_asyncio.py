"""asyncio: pool.asubmit, pool.amap, run_in_executor and wrap_future, on real event loops.

The claims: results and errors arrive without the loop thread ever waiting on
the pool (the loop itself opens the gates the tasks wait on); a full queue parks
admission while the loop keeps running; cancelling the awaiting task drops a
queued pool task, flags a running one, or kills its worker with force_cancel;
amap keeps order (or not, when asked), stops at an error after the results
before it, and cancels what it did not consume.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import threading
from pathlib import Path
from typing import Any, Awaitable

import _faulty
import _tasks
import pytest
from _waiting import until, wait_for, wait_workers_ready
from conftest import make_pool

import fastpool
from fastpool._runtime import _mapper


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _files(tmp_path: Path, *names: str) -> list[str]:
    return [str(tmp_path / n) for n in names]


# ---- asubmit ----------------------------------------------------------------------------


def test_asubmit_returns_the_result_and_raises_the_task_error(pool: fastpool.Pool) -> None:
    async def main() -> None:
        assert await pool.asubmit(_tasks.double, 21) == 42
        assert await pool.asubmit(_tasks.add, 1, b=2) == 3
        with pytest.raises(ValueError, match="boom"):
            await pool.asubmit(_tasks.raise_value_error, "boom")
        got = await asyncio.gather(*(pool.asubmit(_tasks.double, i) for i in range(500)))
        assert got == [2 * i for i in range(500)]

    run(main())


def test_awaiting_a_running_task_leaves_the_loop_free(pool: fastpool.Pool, tmp_path: Path) -> None:
    started, gate = _files(tmp_path, "started", "gate")

    async def main() -> None:
        task = asyncio.create_task(pool.asubmit(_tasks.gated, "v", started, gate))
        await until(lambda: os.path.exists(started), "the task to start")
        assert not task.done()
        open(gate, "w").close()  # only a free loop gets here: the task waits for this
        assert await task == "v"

    run(main())


def test_a_full_queue_parks_admission_without_blocking_the_loop(tmp_path: Path) -> None:
    started, gate = _files(tmp_path, "started", "gate")
    with make_pool(1, max_queue=2) as pool:
        held = pool.submit(_tasks.gated, "held", started, gate)
        wait_for(lambda: os.path.exists(started), what="the first task to start")
        filler = []
        while pool.stats()["queued"] < 2:  # the worker may prefetch some: fill the queue itself
            filler.append(pool.submit(_tasks.double, len(filler)))

        async def main() -> None:
            parked = [asyncio.create_task(pool.asubmit(_tasks.double, 100 + i)) for i in range(5)]
            await asyncio.sleep(0)  # each runs up to its admission
            await asyncio.sleep(0)
            # a blocking submit would have held the loop until the queue drained,
            # which only the gate below allows
            assert not any(t.done() for t in parked)
            assert pool.stats()["queued"] == 2 and pool.stats()["calls_submitted"] == 1 + len(
                filler
            )
            open(gate, "w").close()
            assert await asyncio.gather(*parked) == [
                200 + 2 * i for i in range(5)
            ]  # admitted in order

        run(main())
        assert held.result(timeout=30) == "held"
        assert [f.result(timeout=30) for f in filler] == [2 * i for i in range(len(filler))]


def test_cancelling_the_awaiting_task_drops_a_queued_pool_task(tmp_path: Path) -> None:
    started, gate, trace = _files(tmp_path, "started", "gate", "ran")
    with make_pool(1) as pool:
        held = pool.submit(_tasks.gated, "held", started, gate)

        async def main() -> None:
            task = asyncio.create_task(pool.asubmit(_tasks.touch, trace))
            await until(
                lambda: pool.stats()["calls_submitted"] == 2, "the second task to be submitted"
            )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        run(main())
        open(gate, "w").close()
        assert held.result(timeout=30) == "held"
        pool.drain()
        assert pool.stats()["calls_cancelled"] == 1
        assert not os.path.exists(trace)  # dropped, never run


def test_cancelling_the_awaiting_task_flags_a_running_pool_task(
    pool: fastpool.Pool, tmp_path: Path
) -> None:
    (started,) = _files(tmp_path, "started")
    pids = sorted(wait_workers_ready(pool))

    async def main() -> None:
        task = asyncio.create_task(pool.asubmit(_tasks.cooperative, _tasks.LIMIT_S, started))
        await until(lambda: os.path.exists(started), "the task to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    # the task saw fastpool.cancelled() and returned early: its future settles as cancelled
    wait_for(
        lambda: pool.stats()["calls_cancelled"] == 1,
        what=lambda: f"the cancel to settle: {pool.stats()}",
    )
    assert sorted(pool.pids()) == pids  # no worker was killed
    assert pool.stats()["killed"] == 0


def test_force_cancel_kills_a_running_task_and_the_pool_carries_on(
    pool: fastpool.Pool, tmp_path: Path
) -> None:
    started, gate = _files(tmp_path, "started", "gate")

    async def main() -> None:
        task = asyncio.create_task(
            pool.options(force_cancel=True).asubmit(_tasks.gated, 1, started, gate)
        )
        await until(lambda: os.path.exists(started), "the task to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await pool.asubmit(_tasks.double, 4) == 8

    run(main())
    wait_for(lambda: pool.stats()["crashes"], what="the forced cancel's kill to be recorded")
    assert pool.stats()["crashes"][-1]["cause"] == "cancelled"


def test_a_pool_side_cancel_is_the_pools_cancelled_error(tmp_path: Path) -> None:
    started, gate = _files(tmp_path, "started", "gate")
    with make_pool(1) as pool:
        held = pool.submit(_tasks.gated, "held", started, gate)

        async def main() -> None:
            task = asyncio.create_task(pool.asubmit(_tasks.double, 1))
            await until(
                lambda: pool.stats()["calls_submitted"] == 2, "the second task to be submitted"
            )
            futs = [t.future for t in pool._disp.tasks() if t.future is not held]
            assert len(futs) == 1
            assert pool.cancel(futs[0])  # someone else cancels the pool task
            # concurrent.futures.CancelledError, as result() raises, not asyncio's (that
            # would read as a cancellation of this task itself)
            with pytest.raises(cf.CancelledError):
                await task
            assert not task.cancelled()

        run(main())
        open(gate, "w").close()
        assert held.result(timeout=30) == "held"


def test_asubmit_on_a_closed_pool_raises_pool_closed() -> None:
    with make_pool(1) as pool:
        pool.shutdown()

        async def main() -> None:
            with pytest.raises(fastpool.PoolClosed):
                await pool.asubmit(_tasks.double, 1)

        run(main())


def test_two_event_loops_share_one_pool(pool: fastpool.Pool) -> None:
    results: dict[int, list[int]] = {}

    def loop_thread(k: int) -> None:
        async def main() -> list[int]:
            return list(await asyncio.gather(*(pool.asubmit(_tasks.add, k, i) for i in range(200))))

        results[k] = asyncio.run(main())

    threads = [threading.Thread(target=loop_thread, args=(k,)) for k in (1000, 2000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {k: [k + i for i in range(200)] for k in (1000, 2000)}


def test_inline_fallback_runs_off_the_loop_when_the_circuit_is_open() -> None:
    with make_pool(
        1,
        initializer=_faulty.bad_initializer,
        backoff_base_s=0.01,
        backoff_cap_s=0.02,
        max_failures=2,
    ) as pool:
        with pytest.raises(fastpool.CircuitOpen):
            pool.submit(_tasks.double, 1).result(timeout=30)  # every breaker is open now

        async def main() -> None:
            with pytest.raises(fastpool.CircuitOpen):
                await pool.asubmit(_tasks.double, 1)
            pid, thread = await pool.options(fallback="inline").asubmit(_tasks.where)
            assert pid == os.getpid()  # run by this process ...
            assert thread != threading.get_ident()  # ... but not on the event loop's thread

        run(main())
        assert pool.stats()["calls_inline"] == 1


# ---- the Executor interface under asyncio --------------------------------------------------


def test_run_in_executor_and_wrap_future_keep_working(tmp_path: Path) -> None:
    started, gate = _files(tmp_path, "started", "gate")
    with make_pool(1) as pool:

        async def main() -> str:
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(pool, _tasks.double, 5) == 10
            assert await asyncio.wrap_future(pool.submit(_tasks.add, 2, 3)) == 5
            held = asyncio.wrap_future(pool.submit(_tasks.gated, "held", started, gate))
            await until(lambda: os.path.exists(started), "the first task to start")
            traces = []
            while pool.stats()["queued"] == 0:  # past what the worker prefetches: really queued
                traces.append(str(tmp_path / f"ran{len(traces)}"))
                last = pool.submit(_tasks.touch, traces[-1])
            wrapped = asyncio.wrap_future(last)
            wrapped.cancel()  # wrap_future cancels the pool future: queued, so dropped
            await asyncio.sleep(0)
            assert last.cancelled()
            open(gate, "w").close()
            assert await held == "held"
            return traces[-1]

        trace = run(main())
        pool.drain()
        assert not os.path.exists(trace)


# ---- amap ---------------------------------------------------------------------------------


def test_amap_yields_in_order_and_unordered_when_asked(pool: fastpool.Pool) -> None:
    async def main() -> None:
        assert [x async for x in pool.amap(_tasks.double, range(300), chunksize=7)] == [
            2 * i for i in range(300)
        ]
        got = [x async for x in pool.amap(_tasks.double, (i for i in range(300)), ordered=False)]
        assert sorted(got) == [2 * i for i in range(300)]
        assert [x async for x in pool.amap(_tasks.add, range(10), range(100, 105))] == [
            100,
            102,
            104,
            106,
            108,
        ]
        assert [x async for x in pool.amap(_tasks.double, [])] == []

    run(main())


def test_amap_unordered_yields_what_finishes_first(pool: fastpool.Pool, tmp_path: Path) -> None:
    (gate,) = _files(tmp_path, "gate")

    async def main() -> None:
        got = []
        async for x in pool.amap(
            _tasks.held_first, range(4), [gate] * 4, chunksize=1, ordered=False
        ):
            got.append(x)
            if len(got) == 3:
                open(gate, "w").close()  # item 0 is held until three others came back
        assert got[:3] != [0, 2, 4] and sorted(got) == [0, 2, 4, 6] and got[-1] == 0

    run(main())


def test_amap_raises_an_error_at_its_position_after_the_results_before_it(
    pool: fastpool.Pool,
) -> None:
    async def main() -> None:
        got = []
        with pytest.raises(ValueError, match="item 7 is bad"):
            async for x in pool.amap(_tasks.fail_at, range(20), [7] * 20, chunksize=3):
                got.append(x)
        assert got == [2 * i for i in range(7)]

    run(main())


def test_breaking_out_of_amap_cancels_the_chunks_not_run(
    pool: fastpool.Pool, tmp_path: Path
) -> None:
    (gate,) = _files(tmp_path, "gate")

    window = _mapper.window(pool.workers, 1)  # the map engine's, for chunks of one item
    n = 2 * window + 10

    async def main() -> None:
        async for x in pool.amap(_tasks.first_free, range(n), [gate] * n, chunksize=1):
            assert x == 0
            break  # the iterator is dropped here: no aclose() needed

    run(main())
    stats = pool.stats()
    assert stats["chunks_submitted"] <= window + 1  # the input is read lazily
    assert (
        stats["chunks_cancelled"] >= stats["chunks_submitted"] - 1 - pool.workers
    )  # all but what runs
    open(gate, "w").close()
    pool.drain()
    stats = pool.stats()
    assert stats["chunks_completed"] == 1  # the running ones were flagged and settle as cancelled
    assert stats["chunks_cancelled"] == stats["chunks_submitted"] - 1


def test_cancelling_an_amap_consumer_with_force_kills_its_running_chunks(
    pool: fastpool.Pool, tmp_path: Path
) -> None:
    (gate,) = _files(tmp_path, "gate")

    async def consume() -> list[int]:
        got = []
        async with pool.amap(
            _tasks.first_free, range(20), [gate] * 20, chunksize=1, force_cancel=True
        ) as results:
            async for x in results:
                got.append(x)
        return got

    async def main() -> None:
        task = asyncio.create_task(consume())
        await until(
            lambda: (
                sum(bool(w["current_task"]) for w in pool.stats()["workers"]) == pool.workers
                and pool.stats()["chunks_completed"] == 1
            ),
            "item 0 back and every worker busy",
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await pool.asubmit(_tasks.double, 3) == 6

    run(main())
    wait_for(
        lambda: len(pool.stats()["crashes"]) == pool.workers, what=lambda: f"kills: {pool.stats()}"
    )
    assert {c["cause"] for c in pool.stats()["crashes"]} == {"cancelled"}


def test_amap_counts_progress(pool: fastpool.Pool) -> None:
    calls: list[tuple[int, int | None]] = []

    async def main() -> None:
        got = [
            x
            async for x in pool.amap(
                _tasks.double, range(100), chunksize=9, progress=lambda d, t: calls.append((d, t))
            )
        ]
        assert len(got) == 100

    run(main())
    assert calls[-1] == (100, 100)


def test_amap_rejects_bad_arguments_at_once(pool: fastpool.Pool) -> None:
    with pytest.raises(TypeError, match="at least one iterable"):
        pool.amap(_tasks.add)
    with pytest.raises(ValueError, match="chunksize"):
        pool.amap(_tasks.double, range(3), chunksize=0)
    assert pool.stats()["chunks_submitted"] == 0


def test_the_driver_thread_runs_while_futures_are_pending_and_then_exits(tmp_path: Path) -> None:
    started, gate = _files(tmp_path, "started", "gate")

    def drivers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "fastpool-aio-driver"}

    before = drivers()  # other tests' pools: theirs linger a moment
    mine: set[threading.Thread] = set()
    with make_pool(1) as pool:

        async def main() -> None:
            task = asyncio.create_task(pool.asubmit(_tasks.gated, "v", started, gate))
            await until(lambda: os.path.exists(started), "the task to start")
            mine.update(drivers() - before)  # a future is pending: a thread drives the pool
            open(gate, "w").close()
            assert await task == "v"

        run(main())
    assert len(mine) == 1
    wait_for(lambda: not any(t.is_alive() for t in mine), what="the asyncio driver thread to exit")
