"""Type stubs for fastpool/_runtime/_task.pyx (compiled): Task, Fn and PoolFuture."""

from concurrent.futures import Future
from typing import Any, TypeVar

from typing_extensions import disjoint_base  # a C layout: no class can derive from two of these

from fastpool._supervision._policy import TaskOptions

_T = TypeVar("_T")

class PoolFuture(Future[_T]):
    """A concurrent.futures.Future whose result() drives the pool (made by the pool only)."""

    _task: Task
    _disp: Any
    def __init__(self) -> None: ...  # raises TypeError: submit() makes them

@disjoint_base
class Fn:
    @property
    def id(self) -> int: ...
    @property
    def data(self) -> bytes: ...
    @property
    def name(self) -> str: ...

@disjoint_base
class Task:
    @property
    def id(self) -> int: ...
    attempt: int
    kind: int
    future: PoolFuture[Any] | None
    fn: Fn
    args: bytes
    options: TaskOptions | None
    keep: Any
    transferred: bool
    items: int
    slot: int
    t_submit: int
    t_dispatch: int
    run_ns: int
    cancel_requested: bool
    settled: bool
    rkind: int
    payload: Any
    handoff_src: int
    @property
    def wire(self) -> int: ...
    @property
    def fn_name(self) -> str: ...
    def decode_call(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]: ...
