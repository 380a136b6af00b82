"""``pool.options(...)``: a view of a Pool that submits with supervision options
(``fastpool.pool`` builds it; its own room, so the facade stays one question)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Coroutine, ParamSpec, TypeVar

from fastpool._runtime._call import TaskFunction
from fastpool._supervision import _policy

if TYPE_CHECKING:
    from fastpool.pool import Pool

P = ParamSpec("P")
R = TypeVar("R")


class PoolOptions:
    """``pool.options(...)``: the same pool, with supervision options on each call."""

    def __init__(
        self, pool: Pool, options: _policy.TaskOptions, force_cancel: bool = False
    ) -> None:
        self._pool = pool
        self._options = options
        self._force_cancel = force_cancel

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """``Pool.submit`` with these options.  Thread-safe."""
        if type(fn) is TaskFunction:
            fn = fn.fn
        return self._pool._submit(fn, args, kwargs, self._options)

    def asubmit(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]:
        """``Pool.asubmit`` with these options (and ``force_cancel``)."""
        from fastpool._integrations import _aio

        return _aio.submit(self._pool, fn, args, kwargs, self._options, self._force_cancel)
