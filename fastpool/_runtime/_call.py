"""What the parent and a worker share about one call: running it, a map chunk's
partial failure, and turning a function's pickle back into the function.

The worker's serving loop (``_serve``) runs calls through these; the parent
runs the same code when a task falls back to running inline.  Neither side
imports the other's machinery.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Generic, ParamSpec, TypeVar

from fastpool._runtime import _codec
from fastpool._runtime._lazy import asyncio  # only a task returning a coroutine needs it
from fastpool._supervision import _policy

P = ParamSpec("P")
R = TypeVar("R")

# In a worker: its board and slot (set by _worker.main), for cancelled().
CURRENT: dict[str, Any] = {"board": None, "slot": -1}


def cancelled() -> bool:
    """True inside a task whose cancellation was requested (``pool.cancel(fut)``).

    Long tasks poll it and return early; outside a worker it is always False."""
    board = CURRENT["board"]
    return board is not None and board.cancel_requested(CURRENT["slot"])


def run(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """fn(*args, **kwargs); a coroutine it returns is run to completion."""
    result = fn(*args, **kwargs)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return result


class ChunkFailure:
    """A map chunk that raised part-way: the results before the failing item,
    and the encoded exception.  map yields the results, then raises."""

    __slots__ = ("results", "exc_payload")

    def __init__(self, results: list, exc_payload: bytes) -> None:
        self.results = results
        self.exc_payload = exc_payload

    def __reduce__(self) -> Any:
        return (ChunkFailure, (self.results, self.exc_payload))

    def unpack(self) -> tuple[list, BaseException]:
        return self.results, _codec.decode_exception(self.exc_payload)


def run_chunk(fn: Callable[..., Any], items: list, star: bool) -> list | ChunkFailure:
    """[fn(x) for x in items] (or fn(*x)), iterated in C.  An exception stops the
    chunk: the results so far and the exception come back as a ChunkFailure."""
    out: list = []
    try:
        # list.extend keeps what the iterator produced before it raised
        if star:
            out.extend(
                map(fn, *zip(*items)) if items and _same_arity(items) else (fn(*x) for x in items)
            )
        else:
            out.extend(map(fn, items))
        if out and inspect.iscoroutine(out[0]):
            out = [asyncio.run(c) if inspect.iscoroutine(c) else c for c in out]
    except Exception as exc:  # noqa: BLE001 - reported on the map's channel
        return ChunkFailure(out, _codec.encode_exception(exc))
    return out


def _same_arity(items: list) -> bool:
    # map(fn, *zip(*items)) calls fn(*x) only when every x has the same length
    n = len(items[0])
    return all(len(x) == n for x in items)


_FN_CACHE: dict[bytes, Any] = {}


def load_function(fn_bytes: bytes) -> Any:
    """A task's function in a worker; one from ``__main__`` sees the globals the
    initializer set and brings its classes into ``__main__`` (see _mainns)."""
    from fastpool._runtime import _mainns

    return _mainns.adopt(_codec.loads(fn_bytes))


def load_fn(fn_bytes: bytes) -> Any:
    """The function behind a pickle (cached: one unpickle per distinct function)."""
    fn = _FN_CACHE.get(fn_bytes)
    if fn is None:
        fn = _codec.loads(fn_bytes)
        if len(_FN_CACHE) > 512:
            _FN_CACHE.clear()
        _FN_CACHE[fn_bytes] = fn
    return fn


class TaskFunction(Generic[P, R]):
    """A function with supervision options attached (see ``fastpool.task``).

    Calling it calls the function; pools read ``.options`` when it is submitted
    and send the plain function.  It pickles by reference like the function it
    wraps."""

    def __init__(self, fn: Callable[P, R], options: _policy.TaskOptions) -> None:
        self.fn = fn
        self.options = options
        self.__name__ = getattr(fn, "__name__", "task")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", None)  # type: ignore[assignment]
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (TaskFunction, (self.fn, self.options))
