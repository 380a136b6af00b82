"""What a fastpool child runs for ``fastpool.dask``: a map chunk, and how it fails.

This module is imported inside fastpool's workers, so it imports neither Dask nor
the pool machinery: a replacement child pays for the standard library only.
"""

from __future__ import annotations

import pickle
import time
import traceback
from typing import Any, Callable

from fastpool.errors import RemoteError


class ChunkFailed(Exception):
    """``fn`` raised on item ``len(results)`` of a chunk; ``results`` are the items before it.

    ``Executor.map`` yields those results first, then raises ``error``, so a failing
    item costs no result computed before it (the contract of ``Pool.map``)."""

    def __init__(self, results: list, error: BaseException) -> None:
        super().__init__(results, error)
        self.results = results
        self.error = error

    def __str__(self) -> str:
        return f"item {len(self.results)} of the chunk raised {type(self.error).__name__}: {self.error}"


def _picklable(exc: BaseException) -> BaseException:
    # The chunk's partial results ride on this exception; an unpicklable error would
    # turn the whole ChunkFailed into a RemoteError and lose them.
    try:
        pickle.loads(pickle.dumps(exc, 5))
        return exc
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send a description
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), tb)


def apply_items(fn_bytes: bytes, items: list, star: bool) -> tuple[list, float]:
    """``[fn(*item) if star else fn(item) for item in items]`` and its run time in seconds.

    ``fn`` arrives pickled by cloudpickle: a lambda or a function defined in the
    client's ``__main__`` is an argument here, which a plain pickle would refuse.

    The run time lets the client size the next chunks when the input has no length.
    Raises ``ChunkFailed`` (with the results so far, chained to the error) on the
    first item that raises."""
    fn: Callable[..., Any] = pickle.loads(fn_bytes)
    t0 = time.perf_counter()
    out: list = []
    for item in items:
        try:
            out.append(fn(*item) if star else fn(item))
        except BaseException as exc:  # noqa: BLE001 - SystemExit too, as in Pool.map
            raise ChunkFailed(out, _picklable(exc)) from exc
    return out, time.perf_counter() - t0
