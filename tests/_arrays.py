"""Worker-side functions about arrays: zero copy, transfer, results in shared memory,
and arrays NumPy makes inside a worker (the allocator hook), importable by name.

The hook tasks return where their array's bytes sit in the worker's arena (an offset
from the arena's start) next to the array, so the parent can tell a result sent as it
is (same offset on both sides) from a copy.  fastpool internals are imported where
they are used, so a task that does not need them does not depend on their paths."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

import fastpool

_DATA: list = []
KEPT: list = []


def fill(out, lo: int, hi: int, value: float) -> None:
    out[lo:hi] = value


def total(arr) -> float:
    return float(np.asarray(arr).sum())


def make(n_bytes: int, fill: float) -> Any:
    """A new array, born in the worker (so in the pool's shared memory when large)."""
    return np.full(n_bytes // 8, fill)


def poke(x: Any, i: int, value: float) -> int:
    """Writes one element of the array the task received: if it is the very memory
    the parent holds, the parent sees the write."""
    x[i] = value
    return i


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


# ---- results whose shared blocks must be released though nobody decodes them ---------


def cooperative_array(started, nbytes, limit_s=30.0):
    """``_tasks.cooperative`` (touch ``started``, run until cancelled, at most limit_s),
    then returns an array of nbytes: large enough to travel in the worker's arena
    region with a handoff reference, for a future that is cancelled and never reads it."""
    from _tasks import cooperative

    cooperative(limit_s, started)
    return np.ones(nbytes // 8)


def array_with_a_big_pickle(nbytes, nitems):
    """An array that travels by descriptor (a block handed to the parent) beside a
    list whose pickle is too big for a small ring: the result spills into the arena."""
    return np.ones(nbytes // 8), list(range(nitems))


def unrebuildable_then_array(nbytes):
    """A result that pickles in the worker but fails to unpickle in the parent
    (TwoArgError cannot be rebuilt) before it reaches the array after it."""
    from _tasks import TwoArgError

    return TwoArgError("cannot come back", 7), np.ones(nbytes // 8)


# ---- arrays NumPy makes inside a worker (the allocator hook) ---------------------------


def _where(arr: np.ndarray) -> int:
    from fastpool._native import _ndarray
    from fastpool._runtime import _arrays

    return _ndarray.address_of(arr) - _arrays.process_arena().base_address


def make_with_where(n_bytes: int) -> tuple[Any, int]:
    """A new array and where its bytes sit in the worker's arena region, in a tuple."""
    x = np.full(n_bytes // 8, 2.0)
    return x, _where(x)


def double_where(arr: np.ndarray) -> tuple[np.ndarray, int]:
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
    from fastpool._native import _alloc

    return _alloc.stats()


def in_forked_child(check: Any) -> bool:
    """``check()`` run in a forked child of this process; what it returned (False if it
    raised).  The child reports through a pipe and ends with os._exit."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reported through the pipe
        ok = False
        try:
            ok = bool(check())
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return got == b"1"


def fork_then_report(arr: np.ndarray) -> dict:
    """A task that forks: the child allocates (the handler is inherited, the region is
    not its own) and frees an inherited hook array, then the worker reports."""
    from fastpool._native import _alloc, _ndarray
    from fastpool._runtime import _arrays

    mine = arr * 2
    start = _alloc.stats()["live"]

    def used_malloc() -> bool:
        nonlocal mine
        big = np.ones(4 << 20)
        inside = _ndarray.address_of(big) - _arrays.process_arena().base_address
        region = _arrays.process_arena()
        lo = region.regions_offset + region.proc * region.region_bytes
        del mine, big
        return not lo <= inside < lo + region.region_bytes

    child_used_malloc = in_forked_child(used_malloc)
    ok = bool(mine[3] == 2 * arr[3])
    return {
        "child_used_malloc": child_used_malloc,
        "live_before": start,
        "live_after": _alloc.stats()["live"],
        "intact": ok,
    }


def fork_writes_stay_in_the_child(n: int) -> dict[str, Any]:
    """Makes a hook array (in this worker's arena region) and a shared argument-like
    block, forks, lets the child write both, and reports what this worker sees after."""
    from fastpool._runtime import _arrays

    arena = _arrays.process_arena()
    mine = np.ones(n)  # NumPy's allocator hook: a block of this worker's region
    in_arena = 0 <= _where(mine) < arena.nprocs * arena.region_bytes + arena.regions_offset
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


def add_in_place(arr: np.ndarray, value: float) -> float:
    """Adds value to every element of the argument itself; returns the new sum."""
    arr += value
    return float(arr.sum())


# ---- arrays inside the call's function (issue 31): partial, closure, bound method ------


def described(arr, *_ignored: Any) -> dict:
    """``info`` of an array bound into the task's function, with its class and a checksum
    (the extra arguments are a map's items)."""
    out = info(np.asarray(arr) if type(arr) is np.ndarray else arr)
    out.update(cls=type(arr).__name__, checksum=float(np.asarray(arr).sum()))
    if isinstance(arr, np.ma.MaskedArray):
        out["masked"] = int(arr.mask.sum())
    return out


def described_after_gate(arr, path: str | None) -> dict:
    """``described``, once the gate ``path`` opens (None: at once)."""
    if path is not None:
        from _tasks import open_gate

        open_gate(path)
    return described(arr)


def objects_of(arr) -> list:
    return list(arr)


class Holder:
    """A user object holding an array: its bound method, or itself inside a partial."""

    def __init__(self, arr) -> None:
        self.arr = arr

    def describe(self, *_ignored: Any) -> dict:
        return described(self.arr)


def held(holder: Holder, *_ignored: Any) -> dict:
    return described(holder.arr)


def die_holding(_arr, code: int) -> None:
    os._exit(code)


def big_list(n_items: int, item_bytes: int) -> list:
    """A result whose pickle is n_items * item_bytes: plain bytes, no arrays."""
    return [bytes([i % 256]) * item_bytes for i in range(n_items)]


def stored_len() -> int:
    return len(_DATA[0])


class Tagged(np.ndarray):
    """A user's ndarray subclass with no pickling of its own: NumPy pickles it as an array."""


def sparse_data(matrix, *_ignored: Any) -> dict:
    """``described`` of a scipy.sparse matrix's ``.data``, and the matrix's sum."""
    out = described(matrix.data)
    out["sum"] = float(matrix.sum())
    return out


def held_until(_arr, path: str) -> None:
    """Holds a call's array until the gate ``path`` opens (a timeout kills it first)."""
    from _tasks import open_gate

    open_gate(path)
