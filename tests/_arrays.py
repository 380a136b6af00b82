"""Worker-side functions for the zero-copy tests (importable by name in workers)."""

from __future__ import annotations

import os
import signal

import numpy as np

import fastpool

_HELD: list = []
_DATA: list = []


def fill(out, lo: int, hi: int, value: float) -> None:
    out[lo:hi] = value


def total(arr) -> float:
    return float(np.asarray(arr).sum())


def read_at(arr, i: int) -> float:
    return float(arr[i])


def write_at(arr, i: int, value: float) -> None:
    arr[i] = value


def make_writeable(arr) -> None:
    arr.flags.writeable = True


def info(arr) -> dict:
    b = arr.base
    while isinstance(b, np.ndarray):
        b = b.base
    return dict(
        writeable=arr.flags.writeable,
        shape=arr.shape,
        strides=arr.strides,
        dtype=arr.dtype.str,
        shared=type(b).__name__ == "Block",
        f_contiguous=arr.flags.f_contiguous,
    )


def echo(arr):
    return arr


def double(arr):
    return arr * 2


def hold_then_die(arr) -> None:
    _HELD.append(arr[1:])  # a view: this worker's reference stays until it dies
    os.kill(os.getpid(), signal.SIGKILL)


def die(arr) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def double_and_transfer_back(arr):
    arr *= 2
    return fastpool.transfer(arr)


def store(data) -> None:
    """An initializer: keeps initargs for the tasks."""
    _DATA[:] = [data]


def stored_sum() -> float:
    return float(_DATA[0].sum())


def stored_info() -> dict:
    return info(_DATA[0])


def stored_info_once_all_met(directory: str, n: int) -> tuple[int, dict]:
    """(pid, stored_info()) once ``n`` workers run this at the same time (_tasks.meet)."""
    import _tasks

    return _tasks.meet(directory, n), stored_info()
