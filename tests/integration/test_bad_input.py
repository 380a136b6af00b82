"""Bad input fails only the call that brought it: the pool, its workers and other tasks go on.

"The worker was not restarted" is checked as: the same pids before and after, and
no restart counted in stats().
"""

from __future__ import annotations

import pickle
import re
import threading
import time
from pathlib import Path
from typing import Any

import _tasks
import pytest
from _waiting import wait_for
from conftest import make_pool

import fastpool

RESULT_S = 60


def ready(pool: fastpool.Pool) -> list[int]:
    """Runs one task per worker so every worker has started; returns the sorted pids."""
    deadline = time.monotonic() + RESULT_S
    while len(pool.pids()) < pool.workers or any(
        w["state"] != "ready" for w in pool.stats()["workers"]
    ):
        assert time.monotonic() < deadline, f"workers never became ready: {pool.stats()['workers']}"
        pool.submit(_tasks.noop).result(timeout=RESULT_S)
    return sorted(pool.pids())


def assert_unharmed(pool: fastpool.Pool, pids: list[int]) -> None:
    """Same workers, nothing restarted, and the pool still computes."""
    futures = [pool.submit(_tasks.double, i) for i in range(2 * pool.workers)]
    assert [f.result(timeout=RESULT_S) for f in futures] == [2 * i for i in range(2 * pool.workers)]
    assert sorted(pool.pids()) == pids
    assert pool.stats()["restarts"] == 0
    assert pool.stats()["crashed"] == 0


def fill_queue(pool: fastpool.Pool, gate: Path, n: int) -> list:
    """Submits gated tasks until the pool's queue holds n (prefetched ones do not count)."""
    futures = []
    while pool.stats()["queued"] < n:
        assert len(futures) < n + 64, f"the queue never reached {n}: {pool.stats()}"
        futures.append(pool.submit(_tasks.gate, str(gate), len(futures)))
    return futures


# ---- arguments, results and exceptions that do not pickle ---------------------------


def test_an_unpicklable_argument_fails_submit_and_nothing_else(pool: fastpool.Pool) -> None:
    pids = ready(pool)
    submitted = pool.stats()["calls_submitted"]
    with pytest.raises(fastpool.SerializationError, match=r"argument 1 \(lock\)") as info:
        pool.submit(_tasks.add, 1, threading.Lock())
    assert isinstance(info.value, pickle.PicklingError)
    with pytest.raises(fastpool.SerializationError, match="keyword argument 'x'"):
        pool.submit(_tasks.identity, x=threading.Lock())
    assert pool.stats()["calls_submitted"] == submitted  # nothing was accepted
    assert_unharmed(pool, pids)


@pytest.mark.parametrize("kind", ["lambda", "lock"])
def test_an_unpicklable_result_fails_only_its_future(pool: fastpool.Pool, kind: str) -> None:
    pids = ready(pool)
    before = pool.submit(_tasks.double, 1)
    doomed = pool.submit(_tasks.return_unpicklable, kind)
    after = pool.submit(_tasks.double, 2)
    with pytest.raises(fastpool.SerializationError, match="result of task") as info:
        doomed.result(timeout=RESULT_S)
    assert isinstance(info.value, pickle.PicklingError)
    assert "worker is fine" in str(info.value)
    assert (before.result(timeout=RESULT_S), after.result(timeout=RESULT_S)) == (2, 4)
    assert_unharmed(pool, pids)


@pytest.mark.parametrize("kind", ["lock", "init"], ids=["pickling-fails", "unpickling-fails"])
def test_an_exception_that_cannot_cross_becomes_RemoteError_with_its_type_and_message(
    pool: fastpool.Pool, kind: str
) -> None:
    pids = ready(pool)
    fut = pool.submit(_tasks.raise_unpicklable_exception, "the disk is on fire", kind)
    with pytest.raises(fastpool.RemoteError) as info:
        fut.result(timeout=RESULT_S)
    err = info.value
    expected = "_tasks.LockedError" if kind == "lock" else "_tasks.TwoArgError"
    assert err.type_name == expected
    assert "the disk is on fire" in err.message
    assert expected in str(err) and "the disk is on fire" in str(err)
    assert "raise_unpicklable_exception" in err.traceback_text  # the worker's traceback
    assert "raise_unpicklable_exception" in str(err.__cause__)
    assert_unharmed(pool, pids)


def test_a_stack_overflow_arrives_as_RecursionError_where_a_reducer_pickles_tracebacks() -> None:
    # tblib's reducer (installed by importing Dask) pickles the traceback too; a
    # RecursionError's is too deep to pickle, and once arrived as RemoteError
    # (joblib's test_thread_bomb_mitigation)
    with make_pool(workers=1) as pool:
        fut = pool.submit(_tasks.overflow_the_stack_with_a_traceback_reducer)
        with pytest.raises(RecursionError, match="maximum recursion depth") as info:
            fut.result(timeout=RESULT_S)
        assert "_recurse" in str(info.value.__cause__)  # the worker's traceback, as text
        assert pool.submit(_tasks.double, 4).result(timeout=RESULT_S) == 8


# ---- functions sent by value -------------------------------------------------------


def test_a_lambda_runs_as_a_task(pool: fastpool.Pool) -> None:
    assert pool.submit(lambda x, y=10: x * y, 4).result(timeout=RESULT_S) == 40
    assert list(pool.map(lambda x: -x, range(5), timeout=RESULT_S)) == [0, -1, -2, -3, -4]


def test_a_closure_defined_in_the_test_runs_with_its_captured_values(pool: fastpool.Pool) -> None:
    factor, offset = 3, "captured"

    def scale(x: int) -> tuple[int, str]:
        return x * factor, offset

    assert pool.submit(scale, 5).result(timeout=RESULT_S) == (15, "captured")
    assert sorted(pool.imap_unordered(scale, range(4))) == [
        (0, "captured"),
        (3, "captured"),
        (6, "captured"),
        (9, "captured"),
    ]


def test_a_lambda_or_local_class_anywhere_in_the_arguments_is_sent_by_value(
    pool: fastpool.Pool,
) -> None:
    import functools

    class Local:  # the plain pickler refuses a class defined in a function: cloudpickle's turn
        def __init__(self, v: int) -> None:
            self.v = v

    k = 7
    call = functools.partial(lambda f, x: f(x), lambda x: x + k)
    assert pool.submit(call, 1).result(timeout=RESULT_S) == 8
    assert pool.submit(_tasks.call_with, {"fn": [lambda x: x * k]}, 3).result(RESULT_S) == 21
    assert pool.submit(getattr, Local(5), "v").result(timeout=RESULT_S) == 5


# ---- a full queue ------------------------------------------------------------------


def test_a_full_queue_rejects_at_once_with_on_full_reject(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    with make_pool(1, max_queue=2, on_full="reject") as pool:
        ready(pool)
        futures = fill_queue(pool, gate, 2)
        with pytest.raises(fastpool.QueueFull) as info:
            pool.submit(_tasks.double, 1)
        assert not futures[0].done()  # raised while the first task still ran: it did not wait
        assert info.value.max_queue == 2
        assert pool.stats()["queued"] == 2  # the rejected task was not added
        gate.touch()
        assert [f.result(timeout=RESULT_S)[0] for f in futures] == list(range(len(futures)))
        assert pool.submit(_tasks.double, 21).result(timeout=RESULT_S) == 42  # room again


def test_a_full_queue_blocks_submit_until_a_task_finishes(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    with make_pool(1, max_queue=2) as pool:
        ready(pool)
        futures = fill_queue(pool, gate, 2)
        returned = threading.Event()
        box: dict[str, Any] = {}

        def blocked_submit() -> None:
            try:
                box["future"] = pool.submit(_tasks.double, 21)
                box["returned_at"] = time.monotonic()
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc
            finally:
                returned.set()

        threading.Thread(target=blocked_submit, daemon=True).start()
        assert not returned.wait(0.5), f"submit on a full queue did not block: {box}"
        gate.touch()
        assert returned.wait(RESULT_S), "submit stayed blocked after the queue had room"
        assert "error" not in box, box.get("error")
        _, first_finished_at = futures[0].result(timeout=RESULT_S)
        assert box["returned_at"] >= first_finished_at  # it waited for the first task
        assert box["future"].result(timeout=RESULT_S) == 42
        assert [f.result(timeout=RESULT_S)[0] for f in futures] == list(range(len(futures)))


def test_queue_timeout_raises_QueueFull_after_waiting_that_long(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    with make_pool(1, max_queue=2, queue_timeout=0.2) as pool:
        ready(pool)
        futures = fill_queue(pool, gate, 2)
        t0 = time.monotonic()
        with pytest.raises(fastpool.QueueFull) as info:
            pool.submit(_tasks.double, 1)
        waited = time.monotonic() - t0
        assert waited >= 0.19  # it waited for room (monotonic clock; no upper bound claimed)
        assert not futures[0].done()  # and gave up while the queue was still full
        assert info.value.timeout_s == 0.2
        assert "0.2 s" in str(info.value)
        gate.touch()
        assert [f.result(timeout=RESULT_S)[0] for f in futures] == list(range(len(futures)))


def test_a_done_callback_submitting_into_a_full_queue_does_not_deadlock(tmp_path: Path) -> None:
    gate = tmp_path / "open"
    with make_pool(1, max_queue=2) as pool:
        ready(pool)
        futures = fill_queue(pool, gate, 2)
        out: list = []
        errors: list = []
        # Three submits: the queue is full again after the first, and the callback
        # runs on the thread that collects results; waiting there for room would
        # wait on itself.
        futures[-1].add_done_callback(_tasks.submit_from_callback(pool, 3, out, errors))
        futures[0].add_done_callback(_tasks.submit_from_callback(pool, 3, out, errors))
        gate.touch()
        assert [f.result(timeout=RESULT_S)[0] for f in futures] == list(range(len(futures)))
        wait_for(lambda: len(out) + len(errors) >= 6, RESULT_S, "the callbacks' six submits")
        assert errors == []
        assert sorted(f.result(timeout=RESULT_S) for f in out) == [0, 0, 2, 2, 4, 4]


# ---- a message over the ring limit -------------------------------------------------


def test_an_argument_over_the_arena_fails_submit_with_advice_on_an_idle_pool() -> None:
    """Over the ring's record limit a call spills into shared memory (issue 31); what
    can still fail for size is the arena, and the advice names what would help."""
    with make_pool(1, ring_bytes=1 << 16, arena_bytes=4 << 20) as pool:
        pids = ready(pool)
        assert pool.submit(len, b"x" * 100_000).result(timeout=RESULT_S) == 100_000  # spilled
        with pytest.raises(fastpool.SharedMemoryError) as info:
            pool.submit(_tasks.identity, b"x" * (8 << 20))
        message = str(info.value)
        assert "arena_bytes" in message  # says how to get past the limit
        for name in re.findall(r"\bpool\.(\w+)", message):  # and what it names exists
            assert hasattr(pool, name), f"the advice names pool.{name}, which Pool lacks: {message}"
        assert pool.stats()["inflight"] == 0  # nothing half-submitted stays behind
        assert pool.stats()["queued"] == 0
        assert_unharmed(pool, pids)


def test_an_argument_over_the_arena_fails_submit_while_the_worker_is_busy(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "open"
    with make_pool(1, ring_bytes=1 << 16, arena_bytes=4 << 20) as pool:
        pids = ready(pool)
        running = pool.submit(_tasks.gate, str(gate), "busy")
        with pytest.raises(fastpool.SharedMemoryError, match="arena_bytes"):
            pool.submit(_tasks.identity, b"x" * (8 << 20))
        gate.touch()
        assert running.result(timeout=RESULT_S)[0] == "busy"  # nothing else affected
        assert pool.stats()["inflight"] == 0
        assert_unharmed(pool, pids)


def test_a_result_over_the_ring_limit_arrives_through_shared_memory(tmp_path: Path) -> None:
    """It failed with SerializationError before issue 31 (multiprocessing.Pool has no
    such limit)."""
    started, gate = tmp_path / "started", tmp_path / "open"
    with make_pool(1, ring_bytes=1 << 16) as pool:
        pids = ready(pool)
        fut = pool.submit(_tasks.announce_then_gate, str(started), str(gate), 100_000)
        wait_for(started.exists, what="the task to start")
        gate.touch()
        assert fut.result(timeout=RESULT_S) == "p" * 100_000
        assert pool._arena.usage()["live_blocks"] == 0  # the spilled pickle's block went back
        assert_unharmed(pool, pids)


# ---- a closed pool -----------------------------------------------------------------


def test_a_closed_pool_refuses_work_with_PoolClosed_and_says_why(pool: fastpool.Pool) -> None:
    pool.shutdown(wait=True)
    for call in (
        lambda: pool.submit(_tasks.double, 1),
        lambda: pool.map(_tasks.double, [1]),
        lambda: pool.imap_unordered(_tasks.double, [1]),
    ):
        with pytest.raises(fastpool.PoolClosed, match="shut down") as info:
            call()
        assert isinstance(info.value, RuntimeError)
    pool.shutdown(wait=True)  # idempotent
