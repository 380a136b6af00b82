"""Tasks for tests/integration/test_numpy_hook.py: arrays NumPy makes inside a worker.

Each returns where its array's bytes sit in the worker's arena (an offset from the
arena's start) next to the array, so the parent can tell a result sent as it is
(same offset on both sides) from a copy."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from fastpool._native import _alloc, _ndarray
from fastpool._runtime import _arrays

KEPT: list = []


def _where(arr: np.ndarray) -> int:
    return _ndarray.address_of(arr) - _arrays.process_arena().base_address


def double(arr: np.ndarray) -> tuple[np.ndarray, int]:
    out = arr * 2
    return out, _where(out)


def double_view(arr: np.ndarray) -> tuple[np.ndarray, int]:
    out = (arr * 2)[1::2]
    return out, _where(out)


def double_in_containers(arr: np.ndarray) -> dict[str, Any]:
    a, b = arr * 2, arr * 3
    return {"a": a, "items": [b[::2], "label"], "where": (_where(a), _where(b))}


def double_twice(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    out = arr * 2
    return out, out, _where(out)


def double_and_keep(arr: np.ndarray) -> tuple[np.ndarray, int]:
    out = arr * 2
    KEPT.append(out)
    return out, _where(out)


def scale_kept(factor: float) -> float:
    for a in KEPT:
        a *= factor
    return float(KEPT[-1][1])


def drop_kept() -> int:
    n = len(KEPT)
    KEPT.clear()
    return n


def double_in_a_thread(arr: np.ndarray) -> np.ndarray:
    box = []
    t = threading.Thread(target=lambda: box.append(arr * 2))
    t.start()
    t.join()
    return box[0]


def temporaries(arr: np.ndarray) -> float:
    """Large temporaries that are never returned: each must allocate, arena or not."""
    return float(((arr * 2) + (arr * 3)).sum())


def temporaries_of(n: int) -> float:
    """temporaries() on an array made here, for arenas too small to send one."""
    return temporaries(np.ones(n))


def hook_stats() -> dict:
    return _alloc.stats()


def fork_then_report(arr: np.ndarray) -> dict:
    """A task that forks: the child allocates (the handler is inherited, the region is
    not its own) and frees an inherited hook array, then the worker reports."""
    mine = arr * 2
    start = _alloc.stats()["live"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reported through the pipe
        try:
            big = np.ones(4 << 20)
            inside = _ndarray.address_of(big) - _arrays.process_arena().base_address
            region = _arrays.process_arena()
            lo = region.regions_offset + region.proc * region.region_bytes
            del mine, big
            os.write(w, b"0" if lo <= inside < lo + region.region_bytes else b"1")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    ok = bool(mine[3] == 2 * arr[3])
    return {
        "child_used_malloc": got == b"1",
        "live_before": start,
        "live_after": _alloc.stats()["live"],
        "intact": ok,
    }


def fork_writes_stay_in_the_child(n: int) -> dict[str, Any]:
    """Makes a hook array (in this worker's arena region) and a shared argument-like
    block, forks, lets the child write both, and reports what this worker sees after."""
    mine = np.ones(n)  # NumPy's allocator hook: a block of this worker's region
    in_arena = (
        _where(mine) >= 0
        and _where(mine)
        < _arrays.process_arena().nprocs * (_arrays.process_arena().region_bytes)
        + _arrays.process_arena().regions_offset
    )
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            mine[:] = 9.0
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return dict(
        in_arena=in_arena, child_ok=os.waitstatus_to_exitcode(status) == 0, seen=float(mine.sum())
    )
