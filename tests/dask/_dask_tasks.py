"""Functions only the Dask tests run, in fastpool children (and a few in Dask workers);
the ordinary ones (double, identity, ...) come from tests/_tasks.py and _faulty.py.

Importable by name everywhere: tests/dask/conftest.py puts this directory on
sys.path before the cluster starts, and Dask workers and fastpool templates inherit
sys.path, so these pickle by reference.  Synchronisation goes through FIFOs the test
creates: opening one for writing blocks until the test reads it, so "the task has
started" is an event, not a guess.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil


def where() -> dict:
    """This process, its parent (the template) and the template's parent (the Dask worker)."""
    parent = psutil.Process(os.getppid())
    return {"pid": os.getpid(), "template": parent.pid, "dask_worker": parent.ppid()}


def fail_on(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"item {x} is bad")
    return x


def signal_started(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"1")


def note_pid_then_sigkill(log_path: str) -> None:
    """Appends this child's pid to log_path (one line per attempt), then dies."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def spin_after_signal(path: str) -> None:
    signal_started(path)
    while True:
        pass


def block_until(started: str, go: str) -> int:
    """Says it started, then waits for the test to write to ``go``; returns its pid."""
    signal_started(started)
    with open(go, "rb") as f:
        f.read(1)
    return os.getpid()


def hog_memory(nbytes: int) -> float:
    """Touches nbytes of fresh memory, a page at a time, so RSS grows steadily."""
    a = np.empty(nbytes // 8)
    a[::512] = 1.0  # one write per 4 KiB page
    return float(a[::512].sum())


def big_result(nbytes: int) -> np.ndarray:
    return np.ones(nbytes // 8)


def describe(arr: np.ndarray) -> tuple:
    """What a task sees of an array argument: checksum, writeable (a read-only shared
    copy arrives read-only; a pickled copy would not), and its own pid."""
    return float(arr[::4096].sum()), bool(arr.flags.writeable), arr.nbytes, os.getpid()


def nothing() -> None:
    return None


def crunch(seed: int) -> float:
    """A CPU-bound NumPy chunk: the benchmark's unit of work (a few ms)."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((96, 96))
    return float(np.linalg.eigvalsh(m @ m.T)[-1])


def executing_keys(dask_worker) -> list:  # noqa: ANN001 - a distributed.Worker
    return [str(k) for k, ts in dask_worker.state.tasks.items() if ts.state == "executing"]


def incoming_transfers(key: str, dask_worker) -> list:  # noqa: ANN001
    """Bytes of ``key`` this Dask worker fetched from other workers, one entry per fetch."""
    return [t["keys"][key] for t in dask_worker.transfer_incoming_log if key in t["keys"]]


def fastpool_pids(name: str, dask_worker) -> dict:  # noqa: ANN001
    """The Dask worker's pid, its fastpool template's and its pool's children."""
    from fastpool._runtime import _template

    plugin = dask_worker.plugins.get(name)
    pool = getattr(plugin, "pool", None)
    return {
        "worker": os.getpid(),
        "template": _template.template().pid,
        "children": list(pool.pids()) if pool is not None else [],
    }


def is_daemon() -> bool:
    import multiprocessing

    return multiprocessing.current_process().daemon


def sleep_s(s: float) -> float:
    time.sleep(s)
    return s


def sigkill_dask_worker() -> None:
    """SIGKILLs the Dask worker above this child (the template's parent)."""
    os.kill(psutil.Process(os.getppid()).ppid(), signal.SIGKILL)
    signal.pause()  # the template kills this child once its socket to the worker closes
