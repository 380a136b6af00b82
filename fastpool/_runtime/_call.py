"""What the parent and a worker share about one call: running it, running a map
chunk, and a chunk's partial failure.

The worker's serving loop (``_serve``) runs calls through these; the parent
runs the same code when a task falls back to running inline.  Neither side
imports the other's machinery.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Generic, Literal, ParamSpec, Sequence, TypeVar, overload

from fastpool._runtime import _codec, _numbers
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
    """A map chunk that raised part-way: the results before the failing item, then
    the error.  The one type for a partly failed chunk, whoever ran it (a pool
    worker, or a Dask worker's pool for ``fastpool.dask``): the map engine yields
    ``results``, then raises the error.

    Made where the chunk ran, the error travels encoded (``exc_payload``, as
    ``_codec.encode_exception`` writes it, so an unpicklable error arrives as
    ``RemoteError``) and is decoded once, by ``unpack``.  Made where the error is
    already an object (``caught``), it is kept as it is."""

    __slots__ = ("results", "exc_payload", "_error")

    def __init__(self, results: list, exc_payload: bytes) -> None:
        self.results = results
        self.exc_payload = exc_payload
        self._error: BaseException | None = None

    @classmethod
    def caught(cls, results: list, error: BaseException) -> "ChunkFailure":
        """A failure whose error is at hand; it is encoded only if it is pickled."""
        failure = cls(results, b"")
        failure._error = error
        return failure

    def __reduce__(self) -> Any:
        payload = self.exc_payload
        if self._error is not None and not payload:
            payload = _codec.encode_exception(self._error)
        return (ChunkFailure, (self.results, payload))

    def unpack(self) -> tuple[list, BaseException]:
        """(results, error); the error's remote traceback is its ``__cause__``."""
        if self._error is None:
            self._error = _codec.decode_exception(self.exc_payload)
        return self.results, self._error


def run_chunk(
    fn: Callable[..., Any], items: Sequence[Any], star: bool
) -> list | _numbers.Numbers | ChunkFailure:
    """[fn(x) for x in items] (or fn(*x)), iterated in C.  An exception stops the
    chunk: the results so far and the exception come back as a ChunkFailure.

    Results that are all numbers come back packed (``_numbers``): one buffer to
    send, a tuple where it is unpickled (the map engine hands a tuple out as it
    is).  Only a chunk's results are packed: a task that returns a list of
    numbers gets its list back."""
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
    packed = _numbers.pack(out)
    return out if packed is None else packed


def ride(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """The function a call runs when its own function rides in the call's arguments
    (it holds arrays that cross through shared memory: ``_codec.function_bytes``)."""
    return fn(*args, **kwargs)


def ride_chunk(
    fn: Callable[..., Any], items: Sequence[Any], star: bool
) -> list | _numbers.Numbers | ChunkFailure:
    """``ride`` for a map chunk: ``run_chunk`` of the function that rode in with it."""
    return run_chunk(fn, items, star)


def _same_arity(items: list) -> bool:
    # map(fn, *zip(*items)) calls fn(*x) only when every x has the same length
    n = len(items[0])
    return all(len(x) == n for x in items)


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


@overload
def task(fn: Callable[P, R], /) -> TaskFunction[P, R]: ...
@overload
def task(
    *, pure: bool = ..., timeout: float | None = ..., fallback: Literal["inline"] | None = ...
) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...


def task(
    fn: Callable[P, R] | None = None,
    *,
    pure: bool = False,
    timeout: float | None = None,
    fallback: Literal["inline"] | None = None,
) -> TaskFunction[P, R] | Callable[[Callable[P, R]], TaskFunction[P, R]]:
    """Decorator: ``@fastpool.task(pure=True, timeout=5, fallback="inline")``.

    Attaches supervision options to a function; every pool that runs it applies
    them (see ``Pool.options`` for their meaning).  Raises ValueError for bad options."""
    opts = _policy.TaskOptions(pure=pure, timeout=timeout, fallback=fallback)
    if fn is None:
        return lambda f: TaskFunction(f, opts)
    return TaskFunction(fn, opts)
