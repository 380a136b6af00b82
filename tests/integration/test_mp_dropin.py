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
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _tasks
import pytest
from _waiting import wait_for, wait_gone

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


# ---- terminate(): its own path, not Ctrl-C's -------------------------------------------------


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Runs fn on a thread; the list gets its result or its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("chunksize", [1, 3])
@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_terminate_while_imap_reads_its_input_ends_the_iterator(
    method: str, chunksize: int
) -> None:
    """Defect 8: terminate() returns while the input is blocked, and the iterator raises
    BrokenPool once, then StopIteration: it never hangs, and nothing it still had to read
    arrives later. multiprocessing.Pool has no such promise (its results never complete)."""
    p = fastpool.mp.Pool(2)
    reading, release = threading.Event(), threading.Event()

    def items() -> Iterator[int]:
        yield from range(4)
        reading.set()
        release.wait(WAIT_S)
        yield from range(4, 8)

    it = getattr(p, method)(_tasks.double, items(), chunksize)
    assert reading.wait(WAIT_S)
    t, _ = _in_thread(p.terminate)
    t.join(WAIT_S)
    assert not t.is_alive(), "terminate() waited for the input"
    got: list[Any] = []
    with pytest.raises(fastpool.BrokenPool, match="terminated"):
        while True:
            got.append(it.next(timeout=WAIT_S))
    assert set(got) <= {0, 2, 4, 6}
    with pytest.raises(StopIteration):
        it.next(timeout=WAIT_S)
    release.set()
    p.join()


def test_terminate_fails_another_threads_map_with_broken_pool_and_sends_no_sigint(
    tmp_path: Path,
) -> None:
    """Defect 8: the map raises BrokenPool (not KeyboardInterrupt), and the tasks it ran were
    killed without a SIGINT first (their handler would have noted one)."""
    p = fastpool.mp.Pool(2)
    gate = tmp_path / "never-opened"
    noted = [str(tmp_path / f"sigint-{i}") for i in range(4)]
    started = [str(tmp_path / f"started-{i}") for i in range(4)]
    calls = [(noted[i], started[i], str(gate)) for i in range(4)]
    t, out = _in_thread(lambda: p.starmap(_tasks.gated_noting_sigint, calls, chunksize=1))
    wait_for(lambda: sum(map(os.path.exists, started)) == 2, WAIT_S, "both workers' tasks")
    p.terminate()
    t.join(WAIT_S)
    assert not t.is_alive()
    assert not any(map(os.path.exists, noted)), "a task got SIGINT"
    assert len(out) == 1 and isinstance(out[0], fastpool.BrokenPool), out
    assert "terminated" in str(out[0])
    p.join()
