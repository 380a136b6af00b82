"""Type stubs for fastpool/_runtime/_task.pyx (compiled): Task, Fn, PoolFuture, Registry, Ledger."""

from concurrent.futures import Future
from typing import Any, TypeVar

from typing_extensions import disjoint_base  # a C layout: no class can derive from two of these

from fastpool._supervision._policy import TaskOptions

_T = TypeVar("_T")

COUNTER_NAMES: tuple[str, ...]
FN_REGISTRY_MAX: int
FN_REGISTRY_BYTES: int

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
    @property
    def rides(self) -> bool: ...

@disjoint_base
class Task:
    @property
    def id(self) -> int: ...
    attempt: int
    kind: int
    future: PoolFuture[Any] | None
    fn: Fn | None
    args: bytes
    options: TaskOptions | None
    keep: Any
    transferred: bool
    items: int
    slot: int
    pin: int
    t_submit: int
    t_dispatch: int
    run_ns: int
    cancel_requested: bool
    settled: bool
    rkind: int
    payload: Any
    handoff_src: int
    arg_facts: Any
    @property
    def wire(self) -> int: ...
    @property
    def fn_name(self) -> str: ...
    def describe_args(self) -> str: ...
    def decode_call(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]: ...

@disjoint_base
class Registry:
    def __new__(cls, nslots: int) -> Registry: ...
    ride_bytes: int

@disjoint_base
class Ledger:
    def counts(self) -> dict[str, int]: ...
    def samples(self) -> tuple[list[int], list[int]]: ...
