"""Functions the joblib backend's tests run inside fastpool workers (importable by name)."""

from __future__ import annotations

import ctypes
import os
import signal
import time
import warnings
from typing import Any


class OddError(Exception):
    """An exception type of the test's own: it must come back as itself."""


def square(x: int) -> int:
    return x * x


def pid_of(_x: Any = None) -> int:
    return os.getpid()


def raise_odd(msg: str) -> None:
    raise OddError(msg)


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def report_then_hang(path: str) -> None:
    """Writes this worker's pid to ``path``, then hangs: the slow task of a timeout test."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(600)


def wait_for_file(path: str, value: Any, limit_s: float = 30.0) -> Any:
    """Returns ``value`` once ``path`` exists (another task creates it)."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return value


def create_file(path: str, value: Any) -> Any:
    with open(path, "w"):
        pass
    return value


def array_facts(a: Any) -> tuple[bool, float, int | None]:
    """Whether the task may write ``a``, its sum, and the shared block it lies in (None:
    a copy of its own)."""
    from fastpool._runtime._arrays import _block_of

    blk = _block_of(a)
    return a.flags.writeable, float(a.sum()), None if blk is None else blk.off


def write_first(a: Any) -> float:
    a.flat[0] = -1.0
    return float(a.flat[0])


def blas_threads() -> list[int]:
    import numpy  # noqa: F401 - loads its BLAS
    from threadpoolctl import threadpool_info

    return sorted({info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"})


def nested(n: int) -> tuple[list[int], list[int], list[str], list[int]]:
    """An inner Parallel with joblib's default nested backend (threads), then one that
    names the fastpool backend: a pool of this worker's own (a nested pool).  Also the
    warnings they gave and the pids that ran the named call's items."""
    from joblib import Parallel, delayed

    inner = Parallel(n_jobs=2)(delayed(square)(i) for i in range(n))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        named = Parallel(n_jobs=2, backend="fastpool")(delayed(square)(i) for i in range(n))
        pids = Parallel(n_jobs=2, backend="fastpool")(delayed(os.getpid)() for _ in range(n))
    return inner, named, [str(w.message) for w in caught], pids


def kind_and_sum(a: Any) -> tuple[str, float]:
    """The class a task received and its sum (a masked array's counts only what is unmasked)."""
    return type(a).__name__, float(a.sum())


def apply(fn: Any, x: Any) -> Any:
    return fn(x)


def note_then_wait(log: str, release: str, i: int) -> int:
    """Appends ``i`` to ``log``, then waits for ``release`` to exist: an exit test's task."""
    with open(log, "a") as f:
        f.write(f"{i}\n")
    return wait_for_file(release, i)


def set_offset(value: int) -> None:
    """An initializer whose initargs the tests build afresh for each call."""
    global OFFSET
    OFFSET = value


def offset(_x: Any = None) -> Any:
    """What the initializer ``set_offset`` stored in this worker."""
    return OFFSET


class LooksLikeAnArray:
    """Unhashable, with ``__array_interface__`` and ``tobytes`` but no ``dtype``: what a PIL
    image offers, without needing PIL."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {"shape": (len(self.data),), "typestr": "|u1", "data": self.data, "version": 3}

    def tobytes(self) -> bytes:
        return self.data
