"""The concurrent.futures.Executor contract, held by fastpool.Pool and ProcessPoolExecutor alike.

Each test in the first part runs twice through the ``executor`` fixture: a claim
ProcessPoolExecutor meets is one fastpool users may rely on.  The second part holds
what only fastpool promises (lazy map, imap_unordered, drain, stats).
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import CancelledError
from typing import Any, Iterator

import _tasks
import pytest

import fastpool

RESULT_S = 60  # generous: the machine is noisy; a hang still fails long before pytest-timeout

# ---- the contract, against both executors -------------------------------------------


def test_results_come_back_in_submission_order(executor: Any) -> None:
    futures = [executor.submit(_tasks.add, i, 1000) for i in range(50)]
    assert [f.result(timeout=RESULT_S) for f in futures] == [i + 1000 for i in range(50)]


def test_keyword_arguments_reach_the_task(executor: Any) -> None:
    assert executor.submit(_tasks.sleep_then, x="kw", s=0).result(timeout=RESULT_S) == "kw"


def test_a_task_exception_comes_back_as_its_own_type_with_the_worker_traceback(
    executor: Any,
) -> None:
    fut = executor.submit(_tasks.raise_value_error, "boom 17")
    with pytest.raises(ValueError, match="boom 17") as info:
        fut.result(timeout=RESULT_S)
    assert type(info.value) is ValueError
    assert isinstance(fut.exception(timeout=RESULT_S), ValueError)
    cause = str(info.value.__cause__)  # the worker's traceback, as text
    assert "raise_value_error" in cause and "ValueError: boom 17" in cause


def test_map_yields_in_input_order(executor: Any) -> None:
    # Later items finish first, so completion order differs from input order.
    delays = [0.05 * (5 - i) for i in range(6)]
    assert list(executor.map(_tasks.sleep_then, range(6), delays, timeout=RESULT_S)) == list(
        range(6)
    )
    assert list(executor.map(_tasks.double, range(300), timeout=RESULT_S)) == [
        2 * i for i in range(300)
    ]


def test_map_raises_at_the_failing_position_after_yielding_the_items_before_it(
    executor: Any,
) -> None:
    got = []
    with pytest.raises(ValueError, match="item 5 is bad"):
        for value in executor.map(_tasks.fail_at, range(10), [5] * 10, timeout=RESULT_S):
            got.append(value)
    assert got == [0, 2, 4, 6, 8]


def test_map_timeout_raises_TimeoutError_when_a_result_is_late(executor: Any) -> None:
    # The first item takes 2 s; the map may wait 0.3 s for it.
    results = executor.map(_tasks.sleep_then, [1, 2], [2.0, 0.0], timeout=0.3)
    with pytest.raises(TimeoutError):
        next(iter(results))


def test_shutdown_wait_runs_every_queued_task_first(executor: Any) -> None:
    futures = [executor.submit(_tasks.sleep_then, i, 0.02) for i in range(20)]
    executor.shutdown(wait=True)
    assert all(f.done() for f in futures)  # settled before shutdown returned, not after
    assert [f.result(timeout=0) for f in futures] == list(range(20))


def test_shutdown_cancel_futures_cancels_what_has_not_started(executor: Any) -> None:
    futures = [executor.submit(_tasks.sleep_then, i, 0.2) for i in range(50)]
    executor.shutdown(wait=True, cancel_futures=True)
    assert all(f.done() for f in futures)
    cancelled = [f for f in futures if f.cancelled()]
    # Two workers ran at most a few tasks in the time submit took; ProcessPoolExecutor
    # also keeps max_workers + 1 calls in its call queue, which it cannot cancel.
    assert len(cancelled) >= 40
    for i, f in enumerate(futures):
        if not f.cancelled():
            assert f.result(timeout=0) == i
        else:
            with pytest.raises(CancelledError):
                f.result(timeout=0)


def test_submit_after_shutdown_raises_RuntimeError(executor: Any) -> None:
    executor.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        executor.submit(_tasks.double, 1)
    if isinstance(executor, fastpool.Pool):
        with pytest.raises(fastpool.PoolClosed):
            executor.submit(_tasks.double, 1)


def test_a_done_callback_that_submits_again_never_deadlocks(executor: Any) -> None:
    chain = _tasks.Chain(executor, steps=50)
    chain.start()
    assert chain.done.wait(RESULT_S), f"the callback chain stalled with {chain.left} steps left"
    assert chain.errors == []
    assert chain.value == 50


def test_a_done_callback_added_after_completion_can_submit(executor: Any) -> None:
    first = executor.submit(_tasks.double, 4)
    assert first.result(timeout=RESULT_S) == 8
    out: list = []
    errors: list = []
    first.add_done_callback(
        _tasks.submit_from_callback(executor, 5, out, errors)
    )  # runs right here
    assert errors == []
    assert [f.result(timeout=RESULT_S) for f in out] == [0, 2, 4, 6, 8]


def test_eight_threads_submitting_at_once_all_get_their_own_results(executor: Any) -> None:
    n_threads, per_thread = 8, 200
    start = threading.Barrier(n_threads)
    results: dict[int, list] = {}
    failures: list[BaseException] = []

    def client(t: int) -> None:
        try:
            start.wait(RESULT_S)
            futures = [executor.submit(_tasks.add, t * 1000, i) for i in range(per_thread)]
            results[t] = [f.result(timeout=RESULT_S) for f in futures]
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(2 * RESULT_S)
    assert not any(th.is_alive() for th in threads), "a submitting thread hung"
    assert failures == []
    assert results == {t: [t * 1000 + i for i in range(per_thread)] for t in range(n_threads)}


def test_context_manager_waits_for_work_and_closes(executor: Any) -> None:
    with executor as ex:
        assert ex is executor
        futures = [ex.submit(_tasks.sleep_then, i, 0.05) for i in range(6)]
    assert all(f.done() for f in futures)
    assert [f.result(timeout=0) for f in futures] == list(range(6))
    with pytest.raises(RuntimeError):
        executor.submit(_tasks.double, 1)


# ---- fastpool only ------------------------------------------------------------------


MAX_CHUNK = 8192  # the largest chunk map picks; the docstring bounds the window in chunks


def test_map_is_lazy_over_an_infinite_iterable(pool: fastpool.Pool) -> None:
    pulled = 0
    cap = 10_000_000  # an eager map ends here with an error instead of eating all memory

    def numbers() -> Iterator[int]:
        nonlocal pulled
        for i in itertools.count():
            if pulled >= cap:
                raise RuntimeError("map consumed the whole input eagerly")
            pulled += 1
            yield i

    done = threading.Event()
    box: dict[str, Any] = {}

    def consume() -> None:
        try:
            it = pool.map(_tasks.double, numbers())
            box["first"] = list(itertools.islice(it, 100))
            box["pulled"] = pulled
            del it  # dropped early: its chunks not yet run are cancelled
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=consume, daemon=True).start()
    assert done.wait(RESULT_S), "map over an infinite generator never returned"
    assert "error" not in box, box.get("error")
    assert box["first"] == [2 * i for i in range(100)]
    window = 2 * pool.workers + 2  # chunks in flight, plus the one refilled per result
    assert box["pulled"] <= (window + 1) * MAX_CHUNK


def test_closing_a_map_early_cancels_the_chunks_not_yet_run(pool: fastpool.Pool) -> None:
    before = pool.stats()
    results = pool.map(_tasks.sleep_then, range(20), [0.3] * 20, chunksize=1)
    assert next(results) == 0
    results.close()  # a generator's close(), as Executor.map returns; the docstring promises it
    pool.drain()
    ran = pool.stats()["calls_completed"] - before["calls_completed"]
    window = 2 * pool.workers + 2
    assert ran <= window + 1, f"{ran} of 20 chunks ran after the map was closed"


def test_map_over_several_iterables_stops_at_the_shortest(pool: fastpool.Pool) -> None:
    assert list(pool.map(_tasks.add, range(10), range(100, 105), timeout=RESULT_S)) == [
        100,
        102,
        104,
        106,
        108,
    ]


def test_imap_unordered_returns_every_result_once(pool: fastpool.Pool) -> None:
    got = list(pool.imap_unordered(_tasks.double, range(1000)))
    assert sorted(got) == [2 * i for i in range(1000)]
    got = list(pool.imap_unordered(_tasks.double, iter(range(500)), chunksize=7))  # no len()
    assert sorted(got) == [2 * i for i in range(500)]


def test_imap_unordered_raises_a_task_exception(pool: fastpool.Pool) -> None:
    with pytest.raises(ValueError, match="item -3 is negative"):
        list(pool.imap_unordered(_tasks.double_non_negative, [1, 2, -3, 4], chunksize=1))


def test_drain_settles_all_queued_tasks_without_cancelling(pool: fastpool.Pool) -> None:
    futures = [pool.submit(_tasks.sleep_then, i, 0.01) for i in range(50)]
    pool.drain()
    assert all(f.done() for f in futures)
    assert not any(f.cancelled() for f in futures)
    assert [f.result(timeout=0) for f in futures] == list(range(50))
    with pytest.raises(fastpool.PoolClosed):
        pool.submit(_tasks.double, 1)


def test_stats_count_submitted_completed_and_failed(pool: fastpool.Pool) -> None:
    before = pool.stats()
    ok = [pool.submit(_tasks.double, i) for i in range(30)]
    bad = pool.submit(_tasks.raise_value_error, "counted")
    assert [f.result(timeout=RESULT_S) for f in ok] == [2 * i for i in range(30)]
    assert isinstance(bad.exception(timeout=RESULT_S), ValueError)
    after = pool.stats()
    assert after["calls_submitted"] - before["calls_submitted"] == 31
    assert after["calls_completed"] - before["calls_completed"] == 30
    assert after["calls_failed"] - before["calls_failed"] == 1
    assert after["queued"] == 0 and after["inflight"] == 0
    assert after["closed"] is False
