"""fastpool.mp.Pool keeps multiprocessing.Pool's contract: one set of test bodies runs
against both ``multiprocessing.Pool`` (forkserver) and ``fastpool.mp.Pool``.

Where fastpool does better than the stdlib (a worker's death, ``terminate`` with
results outstanding: multiprocessing hangs on both), the fastpool-only claims are
marked as such.  The autouse leak check (tests/conftest.py) also runs after every
test here: no process, /dev/shm entry or fd may outlive the pools.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _faulty
import _tasks
import psutil
import pytest

import fastpool
import fastpool.mp

WAIT_S = 60  # a bound on every wait, so a broken pool fails the test instead of hanging it

Make = Callable[..., Any]


@pytest.fixture(params=["multiprocessing", "fastpool"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    """make(*args, **kwargs) -> a Pool of the parametrized kind, terminated after the test."""
    made: list[Any] = []

    def new(*args: Any, **kwargs: Any) -> Any:
        if request.param == "multiprocessing":
            # forkserver: this process runs threads, whose locks fork would copy
            p = multiprocessing.get_context("forkserver").Pool(*args, **kwargs)
        else:
            p = fastpool.mp.Pool(*args, **kwargs)
        made.append(p)
        return p

    new.kind = request.param  # type: ignore[attr-defined]
    yield new
    for p in made:
        p.terminate()
        p.join()
    made.clear()  # multiprocessing's pipes and named semaphores go with the objects


def is_fastpool(make: Make) -> bool:
    return make.kind == "fastpool"  # type: ignore[attr-defined,no-any-return]


def gone(pids: set[int]) -> bool:
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


# ---- map family ------------------------------------------------------------------------


def test_map_and_starmap_return_lists(make: Make) -> None:
    p = make(2)
    out = p.map(_tasks.double, range(20))
    assert isinstance(out, list) and out == [2 * x for x in range(20)]
    assert p.map(_tasks.double, (x for x in range(5)), chunksize=2)[0] == 0
    assert p.map(_tasks.double, []) == []
    assert p.starmap(_tasks.add, [(1, 2), (3, 4)]) == [3, 7]
    assert p.starmap(_tasks.sum_of, [(1,), (1, 2), (1, 2, 3)], chunksize=2) == [1, 3, 6]


def test_map_async_and_starmap_async_call_back_before_ready(make: Make) -> None:
    p = make(2)
    seen: list[Any] = []
    r = p.map_async(_tasks.double, iter(range(10)), callback=seen.append)
    assert r.get(WAIT_S) == [2 * x for x in range(10)]
    assert seen == [[2 * x for x in range(10)]]  # the callback ran before get() returned
    assert r.ready() and r.successful()
    r = p.starmap_async(_tasks.add, [(1, 1), (2, 2)], chunksize=1, callback=seen.append)
    assert r.get(WAIT_S) == [2, 4] and seen[-1] == [2, 4]


def test_a_failing_item_fails_the_map_with_its_own_exception(make: Make) -> None:
    p = make(2)
    with pytest.raises(ValueError, match="item -7 is negative"):
        p.map(_tasks.double_non_negative, [1, -7, 3])
    errs: list[BaseException] = []
    r = p.map_async(
        _tasks.double_non_negative, [1, 2, -3], callback=pytest.fail, error_callback=errs.append
    )
    with pytest.raises(ValueError, match="item -3 is negative"):
        r.get(WAIT_S)
    assert not r.successful()
    assert len(errs) == 1 and type(errs[0]) is ValueError


@pytest.mark.parametrize("chunksize", [1, 3])
def test_imap_yields_in_order_and_imap_unordered_yields_all(make: Make, chunksize: int) -> None:
    p = make(2)
    assert list(p.imap(_tasks.double, range(25), chunksize)) == [2 * x for x in range(25)]
    assert sorted(p.imap_unordered(_tasks.double, range(25), chunksize)) == [
        2 * x for x in range(25)
    ]
    assert list(p.imap(_tasks.double, [], chunksize)) == []


def test_imap_raises_a_failed_item_at_its_position_and_goes_on(make: Make) -> None:
    p = make(2)
    it = p.imap(_tasks.double_non_negative, [1, -1, 2])  # chunksize=1: one task per item
    assert next(it) == 2
    with pytest.raises(ValueError, match="item -1 is negative"):
        next(it)
    assert next(it) == 4
    with pytest.raises(StopIteration):
        next(it)


def test_imap_with_chunks_ends_at_a_failure(make: Make) -> None:
    p = make(2)
    it = p.imap(_tasks.double_non_negative, [1, 2, 3, -4, 5, 6, 7, 8], chunksize=2)
    got: list[int] = []
    with pytest.raises(ValueError, match="item -4 is negative"):
        got.extend(it)
    assert got[:2] == [2, 4]  # fastpool also yields item 3's result, which precedes -4 in its chunk
    assert list(it) == []


def test_imap_next_timeout_raises_multiprocessing_timeout(make: Make, tmp_path: Path) -> None:
    p = make(2)
    gate = tmp_path / "open"
    it = p.imap(_tasks.gate, [str(gate)])
    with pytest.raises(multiprocessing.TimeoutError):
        it.next(timeout=0.05)
    gate.touch()
    assert it.next(timeout=WAIT_S)[0] is None


def test_imap_input_error_is_raised_at_its_position(make: Make) -> None:
    def items() -> Iterator[int]:
        yield 1
        raise KeyError("the input broke")

    p = make(2)
    it = p.imap(_tasks.double, items())
    assert next(it) == 2
    with pytest.raises(KeyError, match="the input broke"):
        next(it)
    assert list(it) == []


# ---- apply family ----------------------------------------------------------------------


def test_apply_and_apply_async(make: Make) -> None:
    p = make(2)
    assert p.apply(_tasks.add, (1, 2)) == 3
    assert p.apply(_tasks.add, (1,), {"b": 5}) == 6
    r = p.apply_async(_tasks.add, [2], {"b": 3})
    assert r.get(WAIT_S) == 5 and r.ready() and r.successful()


def test_async_result_before_it_is_ready(make: Make, tmp_path: Path) -> None:
    p = make(2)
    gate = tmp_path / "open"
    r = p.apply_async(_tasks.gate, (str(gate), "done"))
    assert not r.ready()
    with pytest.raises(ValueError, match="not ready"):
        r.successful()
    assert r.wait(0.01) is None
    with pytest.raises(multiprocessing.TimeoutError):
        r.get(timeout=0.05)
    gate.touch()
    assert r.get(WAIT_S)[0] == "done"
    assert r.successful()


def test_callback_and_error_callback_run_on_one_pool_thread_before_ready(make: Make) -> None:
    p = make(2)
    calls: list[tuple[str, Any, int]] = []
    ok = [
        p.apply_async(
            _tasks.double,
            (i,),
            callback=lambda v: calls.append(("ok", v, threading.get_ident())),
        )
        for i in range(6)
    ]
    bad = p.apply_async(
        _tasks.raise_custom,
        (42,),
        callback=pytest.fail,
        error_callback=lambda e: calls.append(("err", e, threading.get_ident())),
    )
    assert sorted(r.get(WAIT_S) for r in ok) == [0, 2, 4, 6, 8, 10]
    with pytest.raises(_tasks.CustomError):
        bad.get(WAIT_S)
    assert sorted(v for kind, v, _ in calls if kind == "ok") == [0, 2, 4, 6, 8, 10]
    (err,) = [v for kind, v, _ in calls if kind == "err"]
    assert type(err) is _tasks.CustomError and err.code == 42
    threads = {t for _, _, t in calls}
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_an_exception_keeps_its_type_arguments_and_worker_traceback(make: Make) -> None:
    p = make(2)
    with pytest.raises(_tasks.CustomError) as info:
        p.apply(_tasks.raise_custom, (7,))
    assert info.value.code == 7 and info.value.args == (7, "raised on purpose")
    assert "raise_custom" in str(info.value.__cause__)  # the worker's traceback


def test_a_serialization_error_the_task_raised_comes_out_as_itself(make: Make) -> None:
    """Issue 32, defect 4: fastpool.mp raised fastpool's RemoteTraceback (the exception's
    cause) in place of a SerializationError the task raised, taking it for a pickling
    failure of the call's own arguments."""
    p = make(2)
    f = _tasks.raise_serialization_error
    with pytest.raises(fastpool.SerializationError, match="raised by the task") as info:
        p.apply(f, (3,))
    assert "raise_serialization_error" in str(info.value.__cause__)  # the worker's traceback
    with pytest.raises(fastpool.SerializationError, match="item 3"):
        p.apply_async(f, (3,)).get(WAIT_S)
    with pytest.raises(fastpool.SerializationError, match="item 3"):
        p.map(f, range(6), chunksize=2)
    it = p.imap(f, range(6))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(fastpool.SerializationError, match="item 3"):
        next(it)


def test_a_nested_pools_serialization_error_comes_out_of_fastpool_mp_as_itself() -> None:
    import _nested_tasks

    with fastpool.mp.Pool(1) as p:
        with pytest.raises(fastpool.SerializationError, match="_thread.lock") as info:
            p.apply(_nested_tasks.nested_unpicklable_argument, (0,))
        assert type(info.value) is fastpool.SerializationError
        assert "nested_unpicklable_argument" in str(info.value.__cause__)


def test_an_unpicklable_argument_fails_its_result_not_the_call(make: Make) -> None:
    p = make(2)
    r = p.apply_async(_tasks.double, (threading.Lock(),))
    with pytest.raises(Exception, match="pickle"):
        r.get(WAIT_S)
    assert p.apply(_tasks.double, (4,)) == 8


# ---- options ---------------------------------------------------------------------------


def test_initializer_runs_in_every_worker_first(make: Make) -> None:
    p = make(2, initializer=_tasks.set_state, initargs=("initialised",))
    assert set(p.map(_tasks.get_state, range(16), chunksize=1)) == {"initialised"}


def test_maxtasksperchild_replaces_the_worker_after_its_tasks(make: Make) -> None:
    p = make(1, maxtasksperchild=1)
    pids = [p.apply(_tasks.pid) for _ in range(3)]
    assert len(set(pids)) == 3


def test_bad_options_are_refused_as_multiprocessing_refuses_them(make: Make) -> None:
    with pytest.raises(ValueError):
        make(0)
    with pytest.raises(TypeError):
        make(1, initializer=3)
    with pytest.raises(ValueError):
        make(1, maxtasksperchild=0)
    p = make(1)
    with pytest.raises(ValueError):
        p.imap(_tasks.double, [1], chunksize=0)
    with pytest.raises(NotImplementedError):
        pickle.dumps(p)


# ---- life ------------------------------------------------------------------------------


def test_close_finishes_accepted_work_and_join_waits_for_it(make: Make, tmp_path: Path) -> None:
    p = make(2)
    with pytest.raises(ValueError, match="still running"):
        p.join()
    gate = tmp_path / "open"
    held = p.apply_async(_tasks.gated_pid, (str(gate),))
    later = [p.apply_async(_tasks.pid) for _ in range(4)]
    mapped = p.map_async(_tasks.pid, range(8), chunksize=1)
    p.close()
    p.close()  # idempotent
    for call in (
        lambda: p.apply_async(_tasks.pid),
        lambda: p.map(_tasks.pid, [1]),
        lambda: p.imap(_tasks.pid, [1]),
        lambda: p.map_async(_tasks.pid, [1]),
        lambda: p.starmap(_tasks.add, [(1, 2)]),
    ):
        with pytest.raises(ValueError, match="Pool not running"):
            call()
    gate.touch()
    p.join()
    assert held.ready() and all(r.ready() for r in later) and mapped.ready()
    pids = {held.get(), *(r.get() for r in later), *mapped.get()}
    assert gone(pids)  # the workers exited with the pool


def test_terminate_stops_running_work(make: Make, tmp_path: Path) -> None:
    p = make(2)
    gate = tmp_path / "never-opened"
    pids = set(p.map(_tasks.pid, range(8), chunksize=1))
    stuck = p.apply_async(_tasks.gate, (str(gate),))
    p.terminate()
    assert gone(pids)
    with pytest.raises(ValueError, match="Pool not running"):
        p.apply_async(_tasks.pid)
    p.join()
    if is_fastpool(make):  # multiprocessing leaves `stuck` unfinished for ever
        with pytest.raises(fastpool.BrokenPool, match="terminated"):
            stuck.get(timeout=WAIT_S)


def test_with_block_terminates_on_exit(make: Make) -> None:
    with make(2) as p:
        pids = set(p.map(_tasks.pid, range(8), chunksize=1))
    assert gone(pids)
    with pytest.raises(ValueError, match="Pool not running"):
        p.map(_tasks.pid, [1])


def test_methods_are_thread_safe(make: Make) -> None:
    p = make(2)
    failures: list[BaseException] = []

    def client(k: int) -> None:
        try:
            rs = [p.apply_async(_tasks.add, (k, i)) for i in range(20)]
            assert [r.get(WAIT_S) for r in rs] == [k + i for i in range(20)]
            assert p.map(_tasks.double, range(k, k + 50)) == [2 * x for x in range(k, k + 50)]
            assert list(p.imap(_tasks.double, range(10))) == [2 * x for x in range(10)]
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not failures and not any(t.is_alive() for t in threads)


# ---- fastpool only -------------------------------------------------------------------


def test_a_dead_worker_fails_its_result_with_worker_crashed_and_the_pool_goes_on() -> None:
    with fastpool.mp.Pool(2) as p:
        r = p.apply_async(_faulty.sigkill_self)
        with pytest.raises(fastpool.WorkerCrashed, match="SIGKILL"):
            r.get(timeout=WAIT_S)
        assert not r.successful()
        with pytest.raises(fastpool.WorkerCrashed):
            p.map(_faulty.sigkill_at, [1, 2, 3], chunksize=1)
        assert p.map(_tasks.double, range(4)) == [0, 2, 4, 6]


def test_close_join_leaves_no_worker_and_no_shared_memory() -> None:
    shm0 = set(os.listdir("/dev/shm"))
    p = fastpool.mp.Pool(2)
    pids = set(p.fastpool.pids())
    assert p.map(_tasks.double, range(10)) == [2 * x for x in range(10)]
    p.close()
    p.join()
    assert gone(pids)
    assert not {n for n in set(os.listdir("/dev/shm")) - shm0 if str(os.getpid()) in n}
    assert not any(t.name.startswith("fastpool-mp") for t in threading.enumerate())
