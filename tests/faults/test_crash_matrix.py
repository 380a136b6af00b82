"""A crash at every stage of a call's trip, of every kind (issue 15): each case ends in a
specific documented exception on its future (or a raise from ``submit`` for the parent's own
pickling), the parent stays alive, and the pool serves the next task.

stages: the call pickled in the parent, unpickled in the worker; the function running; the
result pickled in the worker, unpickled in the parent; a done-callback.
kinds: an exception, SystemExit, C ``exit()``, a segfault, ``os._exit``.

User code that the parent itself runs (pickling the call, unpickling the result, callbacks)
cannot be survived when it segfaults or exits the process, with any executor: those cases
are skipped with that reason. Cases where the worker dies unpickling its call run in a
subprocess: at the branch start the parent unpickled the dead task's arguments to describe
the crash, and died the same way.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import subprocess
import sys

import _crash_stages as cs
import pytest

import fastpool
from fastpool.errors import SerializationError, WorkerCrashed

pytestmark = pytest.mark.faults

HARD = ("c_exit", "segfault", "os_exit")
PARENT_RUNS_IT = "user code the parent itself runs: no executor survives it"


def _serves(pool: fastpool.Pool, timeout: float = 60) -> None:
    nxt = pool.submit(cs.double, 21)
    done, _ = cf.wait([nxt], timeout=timeout)  # settled by the collector thread
    assert done and nxt.result() == 42


@pytest.mark.parametrize("kind", cs.KINDS)
def test_pickling_the_call_in_the_parent_raises_from_submit(kind):
    if kind in HARD:
        pytest.skip(PARENT_RUNS_IT)
    with fastpool.Pool(1) as pool:
        expected = SerializationError if kind == "exception" else SystemExit
        with pytest.raises(expected):
            pool.submit(len, cs.OnPickle(kind))
        _serves(pool)


@pytest.mark.parametrize("kind", ["exception", "SystemExit"])
def test_unpickling_the_call_in_the_worker_fails_with_the_tasks_own_error(kind):
    with fastpool.Pool(1) as pool:
        fut = pool.submit(len, cs.OnUnpickle(kind))
        with pytest.raises(cs.Boom if kind == "exception" else SystemExit):
            fut.result(timeout=60)
        _serves(pool)


@pytest.mark.parametrize("kind", HARD)
def test_a_worker_dying_while_it_unpickles_the_call_does_not_take_the_parent(kind):
    proc = subprocess.run(
        [sys.executable, cs.__file__, kind],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "WorkerCrashed" in proc.stdout and "served 42" in proc.stdout


@pytest.mark.parametrize("kind", cs.KINDS)
def test_a_crash_while_running(kind):
    with fastpool.Pool(1) as pool:
        fut = pool.submit(cs.run, kind)
        expected = {"exception": cs.Boom, "SystemExit": SystemExit}.get(kind, WorkerCrashed)
        with pytest.raises(expected):
            fut.result(timeout=60)
        _serves(pool)


@pytest.mark.parametrize("kind", cs.KINDS)
def test_pickling_the_result_in_the_worker(kind):
    with fastpool.Pool(1) as pool:
        fut = pool.submit(cs.make, "OnPickle", kind)
        expected = {"exception": SerializationError, "SystemExit": SystemExit}.get(
            kind, WorkerCrashed
        )
        with pytest.raises(expected):
            fut.result(timeout=60)
        _serves(pool)


def test_an_exception_unpickling_the_result_in_the_parent_is_a_serialization_error():
    with fastpool.Pool(1) as pool:
        fut = pool.submit(cs.make, "OnUnpickle", "exception")
        with pytest.raises(SerializationError) as info:
            fut.result(timeout=60)
        assert "Boom('boom')" in str(info.value)
        _serves(pool)


def test_systemexit_unpickling_the_result_in_the_parent_settles_the_future():
    with fastpool.Pool(1) as pool:
        fut = pool.submit(cs.make, "OnUnpickle", "SystemExit")
        with pytest.raises(SerializationError) as info:
            fut.result(timeout=60)
        assert isinstance(info.value.__cause__, SystemExit)
        assert fut.done()
        _serves(pool)


def test_systemexit_unpickling_the_result_on_the_collector_settles_the_future():
    with fastpool.Pool(1) as pool:
        fut = pool.submit(cs.make, "OnUnpickle", "SystemExit")
        done, _ = cf.wait([fut], timeout=30)  # nobody calls result(): the collector unpickles
        assert done
        _serves(pool)


@pytest.mark.parametrize(
    "kind",
    ["exception", "SystemExit"],
)
def test_a_done_callback_that_raises_is_logged_and_the_pool_serves(kind, caplog):
    with fastpool.Pool(1) as pool:
        fut = pool.submit(cs.double, 1)
        fut.add_done_callback(lambda f: cs.fire(kind))
        with caplog.at_level(logging.ERROR):
            done, _ = cf.wait([fut], timeout=60)
            assert done and fut.result() == 2
            _serves(pool, timeout=15)  # a dead collector would never settle it


@pytest.mark.parametrize("stage", ["result_unpickle", "callback"])
@pytest.mark.parametrize("kind", HARD)
def test_hard_crashes_in_the_parents_own_stages(stage, kind):
    pytest.skip(PARENT_RUNS_IT)
