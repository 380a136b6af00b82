"""Type stubs for fastpool/_runtime/_dispatch.pyx (compiled): the path from submit to settle."""

from typing import Any, Callable

from typing_extensions import disjoint_base  # a C layout: no class can derive from two of these

from fastpool._native._core import Board
from fastpool._runtime._task import PoolFuture

PARK_SLICE_S: float
COLLECTOR_GRACE_S: float
NAP_AFTER_S: float
IDLE_PARK_S: float
COUNTER_NAMES: tuple[str, ...]

def set_parent_spin(seconds: float) -> None: ...

@disjoint_base
class DispatchCore:
    @property
    def nslots(self) -> int: ...
    @property
    def max_queue(self) -> int: ...
    @property
    def torn_down(self) -> bool: ...
    # the supervisor sets it before it sleeps; the next accepted task clears it and wakes it
    idle_watch: bool
    def __init__(
        self,
        board: Board,
        nslots: int,
        *,
        max_queue: int,
        reject: bool,
        queue_timeout: float | None,
        max_tasks: int | None,
        arena: Any,
        hooks: Any,
    ) -> None: ...
    def set_hooks(self, hooks: Any) -> None: ...
    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Any = ...,
        wait: bool = ...,
    ) -> PoolFuture[Any]: ...
    def submit_to(
        self, s: int, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> PoolFuture[Any]: ...
    def submit_chunk(
        self, fn: Callable[..., Any], items: Any, star: bool, wait: bool = ..., memo: Any = ...
    ) -> PoolFuture[Any]: ...
    def wait(self, fut: PoolFuture[Any], timeout: float | None = ...) -> bool: ...
    def drive(self, pred: Callable[[], object], timeout: float | None = ...) -> bool: ...
    def collector_loop(self, handoff: Any, should_stop: Callable[[], bool]) -> None: ...
    def holding_drive(self) -> bool: ...
    def lock_drive(self) -> None: ...
    def unlock_drive(self) -> None: ...
    # an inline run (fallback="inline")
    def run_inline(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> PoolFuture[Any]: ...
