"""Tasks that make a fastpool.Pool of their own (a nested pool), for
tests/integration/test_nested_pools.py.  Module level, so workers import them by name."""

from __future__ import annotations

import json
import os
from typing import Any

import fastpool
from fastpool._runtime import _template

RESULT_S = 60


def shared_memory_held() -> tuple[int, int]:
    """(descriptors, mappings) of fastpool's memfds in this process."""
    fds = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:fastpool")
        except OSError:  # the listing's own descriptor, closed since
            pass
    with open("/proc/self/maps") as f:
        maps = sum("/memfd:fastpool" in line for line in f)
    return fds, maps


def nested_abs(x: int) -> dict[str, Any]:
    """abs(-x) computed by a pool made in this task; the pids of that pool's template and
    workers (taken while it runs), this worker's pid, and its fastpool memfds before,
    during and after the nested pool."""
    before = shared_memory_held()
    with fastpool.Pool(1) as inner:
        value = inner.submit(abs, -x).result(timeout=RESULT_S)
        pids = [*inner.pids(), _template.template().pid]
        during = shared_memory_held()
    return {
        "value": value,
        "inner": pids,
        "worker": os.getpid(),
        "shm": [before, during, shared_memory_held()],
    }


def nested_then_hold(started: str, gate: str) -> int:
    """Starts a pool whose one worker holds on ``gate`` (see _tasks.gate); writes this
    worker's pid and the inner pool's pids to ``started`` (atomically), then waits for the
    inner task.  The test SIGKILLs this worker meanwhile."""
    import _tasks

    with fastpool.Pool(1) as inner:
        held = inner.submit(_tasks.gate, gate)
        _waiting_ready(inner)
        pids = {"worker": os.getpid(), "inner": [*inner.pids(), _template.template().pid]}
        with open(started + ".tmp", "w") as f:
            json.dump(pids, f)
        os.rename(started + ".tmp", started)
        held.result(timeout=RESULT_S)
    return os.getpid()


def _waiting_ready(pool: fastpool.Pool) -> None:
    from _waiting import wait_workers_ready

    wait_workers_ready(pool, 1)


def nested_unpicklable_argument(_: Any = None) -> Any:
    """Submits a lock to a pool made in this task: the nested pool raises its
    SerializationError to the task, which lets it go."""
    import threading

    with fastpool.Pool(1) as inner:
        return inner.submit(abs, threading.Lock()).result(timeout=RESULT_S)
