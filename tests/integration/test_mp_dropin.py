"""``fastpool.mp.Pool`` where multiprocessing's own pool tests found it was no drop-in.

Each test names the case of CPython's ``test._test_multiprocessing`` it stands for (the whole
suite runs through tests/compat/cpython_mp.py, a peer suite); here each runs on its own,
against ``multiprocessing.Pool`` as well where multiprocessing defines the behaviour, so the
expectation is the stdlib's and not ours.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.pool
import os
import subprocess
import sys
import textwrap
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _tasks
import pytest
from _waiting import wait_gone

import fastpool
import fastpool.mp

WAIT_S = 60

Make = Callable[..., Any]


@pytest.fixture(params=["multiprocessing", "fastpool"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    """make(*args) -> a Pool of the parametrized kind (multiprocessing's under forkserver:
    this process runs threads), terminated after the test."""
    made: list[weakref.ref[Any]] = []  # a test may drop its pool

    def new(*args: Any) -> Any:
        if request.param == "multiprocessing":
            p = multiprocessing.get_context("forkserver").Pool(*args)
        else:
            p = fastpool.mp.Pool(*args)
        made.append(weakref.ref(p))
        return p

    new.kind = request.param  # type: ignore[attr-defined]
    yield new
    for ref in made:
        if (p := ref()) is not None:
            p.terminate()
            p.join()


# A script run as __main__ in a fresh process, so that its first pool makes the worker
# template: what the parent did before that pool is what the template (and every worker
# forked from it) inherits.
PROXIES_BEFORE_THE_FIRST_POOL = textwrap.dedent("""
    import multiprocessing
    import os
    import sys

    ctx = multiprocessing.get_context(sys.argv[2])
    if sys.argv[1] == "fastpool":
        from fastpool.mp import Pool
    else:
        Pool = ctx.Pool

    def initializer(seen):
        seen.append(os.getpid())

    def read(ns):
        return ns.x, os.getpid()

    if __name__ == "__main__":
        with ctx.Manager() as manager:
            ns = manager.Namespace()
            ns.x = 7  # the parent's proxy now holds a connection to the manager
            seen = manager.list()
            pool = Pool(2, initializer, (seen,))
            got = [pool.apply(read, (ns,)), *pool.map(read, [ns] * 4, chunksize=1)]
            pool.close()
            pool.join()
            assert {x for x, _ in got} == {7}, got
            assert {pid for _, pid in got} <= set(seen), (got, seen)
            print("OK")
""")


def _run(tmp_path: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
    )


@pytest.mark.parametrize(
    ("kind", "method", "template"),
    [
        ("multiprocessing", "fork", ""),
        ("multiprocessing", "forkserver", ""),
        ("fastpool", "fork", "fork"),
        ("fastpool", "forkserver", "fork"),  # 3.14's default start method
        ("fastpool", "forkserver", "spawn"),
    ],
)
def test_manager_proxies_work_in_workers_after_the_parent_used_them(
    tmp_path: Path, kind: str, method: str, template: str
) -> None:
    """TestInitializers.test_pool_initializer: a proxy the parent used before its first pool
    works in the initializer and in tasks, whichever start method made the manager. A forked
    template (as for a small parent with one thread) inherits the parent's cached connection
    to the manager; a spawned one inherits nothing but must share the parent's authkey."""
    proc = _run(
        tmp_path, PROXIES_BEFORE_THE_FIRST_POOL, kind, method, FASTPOOL_TEMPLATE_START=template
    )
    assert proc.returncode == 0 and proc.stdout == "OK\n", proc.stdout + proc.stderr[-3000:]


# ---- the errors multiprocessing raises ---------------------------------------------------


class PicklingRaises:
    """Its pickling raises RuntimeError, as test_map_unplicklable's class A does."""

    def __reduce__(self) -> Any:
        raise RuntimeError("cannot pickle")


def test_an_argument_whose_pickling_raises_propagates_that_exception(make: Make) -> None:
    """_TestPool.test_map_unplicklable: the RuntimeError itself, from map and apply_async."""
    p = make(2)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        p.map(_tasks.double, [PicklingRaises()] * 10)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        p.apply_async(_tasks.double, (PicklingRaises(),)).get(WAIT_S)
    assert p.map(_tasks.double, [1, 2]) == [2, 4]  # nothing was lost or broken


def test_an_unpicklable_result_raises_maybe_encoding_error(make: Make) -> None:
    """_TestPoolWorkerErrors.test_unpickleable_result: MaybeEncodingError, with its exc and
    value, on get() and to the error callback; the pool keeps its workers."""
    p = make(2)
    for _ in range(3):
        seen: list[BaseException] = []
        r = p.apply_async(_tasks.return_unpicklable, ("lock",), error_callback=seen.append)
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as info:
            r.get(WAIT_S)
        assert seen == [info.value] and info.value.exc and info.value.value
        if make.kind == "fastpool":  # type: ignore[attr-defined]
            assert isinstance(info.value, fastpool.SerializationError)
    assert p.apply(_tasks.double, (4,)) == 8


def test_a_task_exception_has_multiprocessing_remote_traceback_as_its_cause(make: Make) -> None:
    """_TestPool.test_traceback: the cause is multiprocessing.pool.RemoteTraceback holding the
    worker's traceback; an input error is raised as itself, with no cause."""
    p = make(1)
    with pytest.raises(_tasks.CustomError) as info:
        p.apply(_tasks.raise_custom, (7,))
    cause = info.value.__cause__
    assert type(cause) is multiprocessing.pool.RemoteTraceback
    assert 'raise CustomError(code, "raised on purpose")' in cause.tb

    def broken() -> Iterator[int]:
        raise KeyError("the input broke")
        yield 0

    with pytest.raises(KeyError) as input_error:
        p.map(_tasks.double, broken(), 1)
    assert input_error.value.__cause__ is None


def test_a_dropped_running_pool_warns_with_resource_warning(make: Make) -> None:
    """_TestPool.test_resource_warning: the test forces the state of a terminated pool back
    to RUN (a property here, so that the state stays where the pool's threads read it)."""
    p = make(1)
    p.terminate()
    p.join()
    p._state = multiprocessing.pool.RUN
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        p = None
        gc.collect()


def test_a_running_pool_dropped_warns_and_closes_itself() -> None:
    p = fastpool.mp.Pool(1)
    assert p.apply(_tasks.double, (2,)) == 4
    inner = p.fastpool  # its threads hold it, never the mp.Pool object
    pids = inner.pids()
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        p = None
        gc.collect()
    wait_gone(pids, WAIT_S)
    with pytest.raises(fastpool.PoolClosed):
        inner.submit(_tasks.double, 1)


# ---- imap over an input that breaks --------------------------------------------------------


class SayWhenError(ValueError):
    pass


def _says_when(total: int, when: int) -> Iterator[int]:
    for i in range(total):
        if i == when:
            raise SayWhenError("Somebody said when")
        yield i


@pytest.mark.parametrize(("chunksize", "completed"), [(1, 3), (2, 6), (4, 4)])
def test_imap_yields_the_completed_chunks_then_the_input_error(
    make: Make, chunksize: int, completed: int
) -> None:
    """_TestPool.test_imap_handle_iterable_exception: the input breaks at item 7 (item 3 with
    chunksize 1); the chunks read before it come back, then SayWhenError, then nothing."""
    p = make(2)
    when = 3 if chunksize == 1 else 7
    it = p.imap(_tasks.double, _says_when(20, when), chunksize)
    assert [next(it) for _ in range(completed)] == [2 * i for i in range(completed)]
    with pytest.raises(SayWhenError):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
