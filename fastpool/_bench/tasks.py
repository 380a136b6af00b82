"""Functions the benchmarks run inside workers (``python -m fastpool bench`` and benchmarks/).

They live in the installed package, importable by name, so that every peer sends
them by reference under every start method: a spawned worker (loky, forkserver)
imports ``fastpool._bench.tasks`` like any module, with no path set-up.

NumPy is imported lazily, inside the functions that need it, so that a spawned
worker which only runs ``noop`` does not pay for the import, and ``import_numpy``
measures what it says.
"""

from __future__ import annotations

import os
import time


def noop(*_args, **_kwargs):
    return None


def identity(x):
    return x


def square(x):
    return x * x


def total(arr) -> float:
    """One way: the array goes to the worker, a float comes back."""
    return float(arr.sum())


def part_total(arr, i: int, parts: int) -> float:
    """Part ``i`` of ``parts`` row blocks of a shared input: each task reads its share."""
    rows = arr.shape[0]
    return float(arr[i * rows // parts : (i + 1) * rows // parts].sum())


def double(arr):
    """Round trip: the array goes to the worker, a new array as large comes back."""
    return arr * 2


def fill_double(src, out, lo: int, hi: int) -> int:
    """The "worker fills a shared output" idiom: writes ``out[lo:hi] = 2 * src[lo:hi]``.

    Only meaningful when ``src`` and ``out`` are views of shared memory; with a
    pickled ``out`` the parent never sees the write.
    """
    import numpy as np

    np.multiply(src[lo:hi], 2, out=out[lo:hi])
    return hi - lo


def import_numpy() -> str:
    import numpy

    return numpy.__version__


def getpid() -> int:
    return os.getpid()


def warm(delay_s: float) -> int:
    """Warm-up task: loads numpy, lingers so that other workers get a task too."""
    import numpy  # noqa: F401  (the array benchmarks must not time this import)

    time.sleep(delay_s)
    return os.getpid()


def cpu_spin(seconds: float) -> float:
    """``seconds`` of this thread's CPU time, spent spinning (not sleeping): a CPU-bound task
    whose length the scheduler cannot shorten. Returns the CPU time spent."""
    start = time.thread_time()
    end = start + seconds
    while (now := time.thread_time()) < end:
        pass
    return now - start


def soft_threshold(x, clip: float = 3.0, shrink: float = 0.5):
    """A slice of a batch: standardised, clipped to +-``clip``, soft-thresholded by
    ``shrink``; a new array of the same dtype and size back."""
    import numpy as np

    y = x - x.mean(dtype=np.float64)
    y /= y.std(dtype=np.float64) + 1e-12
    np.clip(y, -clip, clip, out=y)
    sign = np.sign(y)
    np.abs(y, out=y)
    y -= shrink
    np.maximum(y, 0, out=y)
    y *= sign
    return y
