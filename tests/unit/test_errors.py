"""Claims about fastpool.errors: every class pickles intact and is what callers already catch."""

from __future__ import annotations

import concurrent.futures
import copy
import inspect
import pickle
import queue
from concurrent.futures.process import BrokenProcessPool

import pytest

import fastpool
from fastpool import errors

# One realistic instance per class, built the way fastpool builds it.  A class
# added to errors.py without a sample here fails test_every_class_has_a_sample.
SAMPLES: dict[type, BaseException] = {
    errors.FastPoolError: errors.FastPoolError("something went wrong"),
    errors.BrokenPool: errors.BrokenPool("the pool was shut down before this task ran"),
    errors.WorkerCrashed: errors.WorkerCrashed(
        1, 4242, -9, 17, "function f(ndarray(3,) float64 24 B)"
    ),
    errors.PoisonTask: errors.PoisonTask(0, 4243, -11, 18, "killed two workers"),
    errors.WorkerHung: errors.WorkerHung(2, 4244, -9, 19, "no heartbeat for 10.2 s"),
    errors.WorkerMemoryError: errors.WorkerMemoryError(
        3,
        4245,
        -9,
        20,
        "over the limit",
        reason="oom-killer",
        limit_bytes=2**30,
        rss_bytes=2**30 + 5,
        peak_rss_bytes=2**31,
    ),
    errors.InitializerError: errors.InitializerError("initializer raised ValueError: no config", 1),
    errors.TaskTimeout: errors.TaskTimeout(21, 2.5, 0),
    errors.CircuitOpen: errors.CircuitOpen(12.5, "died: SIGSEGV"),
    errors.PoolClosed: errors.PoolClosed(),
    errors.QueueFull: errors.QueueFull(512, 0.2),
    errors.SerializationError: errors.SerializationError(
        "argument 0 (lock)", "TypeError: cannot pickle"
    ),
    errors.RemoteError: errors.RemoteError("app.DbError", "the disk is on fire", "Traceback ...\n"),
    errors.DetachedBufferError: errors.DetachedBufferError("the array was transferred to task 3"),
    errors.SharedMemoryError: errors.SharedMemoryError("need 64 MiB of /dev/shm, 12 MiB free"),
    errors.SegmentCorrupt: errors.SegmentCorrupt("magic mismatch on attach"),
    errors.RegionCorrupt: errors.RegionCorrupt(1, "top past the end", 64),
}

# What each class must also be, beyond FastPoolError: what callers of
# concurrent.futures, queue and pickle already catch.
MUST_BE: dict[type, tuple[type, ...]] = {
    errors.BrokenPool: (BrokenProcessPool, concurrent.futures.BrokenExecutor),
    errors.WorkerCrashed: (errors.BrokenPool, BrokenProcessPool),
    errors.PoisonTask: (errors.WorkerCrashed, BrokenProcessPool),
    errors.WorkerHung: (errors.WorkerCrashed, BrokenProcessPool),
    errors.WorkerMemoryError: (errors.WorkerCrashed, MemoryError, BrokenProcessPool),
    errors.InitializerError: (errors.BrokenPool, BrokenProcessPool),
    errors.TaskTimeout: (errors.FastPoolError,),
    errors.CircuitOpen: (RuntimeError,),
    errors.PoolClosed: (RuntimeError,),
    errors.QueueFull: (queue.Full,),
    errors.SerializationError: (pickle.PicklingError, pickle.PickleError),
    errors.DetachedBufferError: (ValueError,),
    errors.SharedMemoryError: (MemoryError,),
    errors.RegionCorrupt: (errors.SegmentCorrupt,),
}


# What a class must NOT be: a failure for good must not read as "still running".
MUST_NOT_BE: dict[type, tuple[type, ...]] = {
    errors.TaskTimeout: (TimeoutError,),
    errors.WorkerHung: (TimeoutError,),
}


def test_a_task_killed_for_time_is_not_a_wait_that_timed_out() -> None:
    # result(timeout=...) raises TimeoutError while the task still runs; a task that
    # fastpool killed for its time raises TaskTimeout / WorkerHung, which one
    # `except TimeoutError` clause must not swallow.
    for cls, forbidden in MUST_NOT_BE.items():
        for base in forbidden:
            assert not issubclass(cls, base), f"{cls.__name__} is a {base.__name__}"


def error_classes() -> list[type]:
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ]


def test_every_class_has_a_sample() -> None:
    assert set(error_classes()) == set(SAMPLES)


def test_every_class_is_exported_from_the_package() -> None:
    for cls in error_classes():
        assert getattr(fastpool, cls.__name__) is cls
        assert cls.__name__ in errors.__all__


def raised(exc: BaseException) -> BaseException:
    """A copy of the instance as it crosses processes: raised, with a traceback and a cause.

    A copy: raising SAMPLES' own instance gave it that cause for the tests after this one,
    and a copy pickled after tblib's pickling support is installed (distributed installs
    it; test_bench_workloads imports Dask) carries its cause along."""
    exc = copy.copy(exc)
    try:
        raise exc from KeyError("cause")
    except BaseException as caught:  # noqa: BLE001
        return caught


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_pickle_round_trip_keeps_type_args_attributes_and_message(cls: type, protocol: int) -> None:
    original = raised(SAMPLES[cls])
    copy = pickle.loads(pickle.dumps(original, protocol))
    assert type(copy) is cls
    assert copy.args == original.args
    assert vars(copy) == vars(original)
    assert str(copy) == str(original)
    assert repr(copy) == repr(original)


def test_facts_survive_the_round_trip_by_name() -> None:
    crashed = pickle.loads(pickle.dumps(SAMPLES[errors.WorkerCrashed]))
    assert (crashed.worker_id, crashed.pid, crashed.exitcode, crashed.task_id) == (1, 4242, -9, 17)
    assert crashed.signal_name == "SIGKILL"
    assert "OOM killer" in str(crashed)
    # the cause (how the process ended) is made by __init__, so the copy has it too
    assert "Process 4242 (fastpool worker 1) terminated abruptly with exit code -9 (SIGKILL)" in (
        crashed.__cause__.tb
    )
    mem = pickle.loads(pickle.dumps(SAMPLES[errors.WorkerMemoryError]))
    assert (mem.reason, mem.limit_bytes, mem.rss_bytes, mem.peak_rss_bytes) == (
        "oom-killer",
        2**30,
        2**30 + 5,
        2**31,
    )
    assert "kernel's OOM killer" in str(mem)
    timeout = pickle.loads(pickle.dumps(SAMPLES[errors.TaskTimeout]))
    assert (timeout.task_id, timeout.timeout_s, timeout.worker_id) == (21, 2.5, 0)
    full = pickle.loads(pickle.dumps(SAMPLES[errors.QueueFull]))
    assert (full.max_queue, full.timeout_s) == (512, 0.2)
    remote = pickle.loads(pickle.dumps(SAMPLES[errors.RemoteError]))
    assert (remote.type_name, remote.message) == ("app.DbError", "the disk is on fire")
    circuit = pickle.loads(pickle.dumps(SAMPLES[errors.CircuitOpen]))
    assert (circuit.retry_after_s, circuit.last_cause) == (12.5, "died: SIGSEGV")


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_each_class_is_what_callers_already_catch(cls: type) -> None:
    exc = SAMPLES[cls]
    assert isinstance(exc, errors.FastPoolError)
    for base in MUST_BE.get(cls, ()):
        assert isinstance(exc, base), f"{cls.__name__} is not a {base.__name__}"
        with pytest.raises(base):  # caught by an except clause naming only the stdlib class
            raise exc


def test_signal_name_spells_signals_and_nothing_else() -> None:
    assert errors.signal_name(-9) == "SIGKILL"
    assert errors.signal_name(-11) == "SIGSEGV"
    assert errors.signal_name(0) is None
    assert errors.signal_name(3) is None
    assert errors.signal_name(None) is None
