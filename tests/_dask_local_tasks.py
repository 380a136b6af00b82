"""Tasks the Dask local-scheduler tests (tests/integration/test_dask_local.py) run in workers."""

from __future__ import annotations

from typing import Any

import numpy as np

MIB = 2**20


def make(n_bytes: int, fill: float) -> Any:
    """A new array, born in the worker (so in the pool's shared memory when large)."""
    return np.full(n_bytes // 8, fill)


def poke(x: Any, i: int, value: float) -> int:
    """Writes one element of the array the task received: if it is the very memory
    the parent holds, the parent sees the write."""
    x[i] = value
    return i


def total(x: Any) -> float:
    return float(x.sum())


def inc(x: int) -> int:
    return x + 1


def add(a: Any, b: Any) -> Any:
    return a + b


def make_with_where(n_bytes: int) -> tuple[Any, int]:
    """A new array and where its bytes sit in the worker's arena region (as
    tests/_hook_tasks.py reports it), in a tuple: Dask nests it four deep."""
    from _hook_tasks import _where

    x = np.full(n_bytes // 8, 2.0)
    return x, _where(x)


def die(x: Any) -> Any:
    """SIGKILLs its own worker."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return x
