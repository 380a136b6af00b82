"""Functions the multiprocessing-compatibility suite (tests/integration/test_mp_compat.py) runs.

Module level, so both ``multiprocessing.Pool`` (forkserver) and ``fastpool.mp.Pool``
workers import them by name.
"""

from __future__ import annotations

import os
from typing import Any

from _tasks import double, double_non_negative, gate, sigkill_self  # noqa: F401 - re-exported

_STATE: list[Any] = ["unset"]


class CustomError(Exception):
    """An exception of the test's own type, with arguments: it must come back as itself."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)
        self.code = code


def raise_custom(code: int) -> None:
    raise CustomError(code, "raised on purpose")


def add(a: Any, b: Any = 0) -> Any:
    return a + b


def total(*args: Any) -> Any:
    return sum(args)


def set_state(value: Any) -> None:
    _STATE[0] = value


def get_state(_: Any = None) -> Any:
    return _STATE[0]


def pid(_: Any = None) -> int:
    return os.getpid()


def gated_pid(path: str) -> int:
    gate(path)
    return os.getpid()


def sigkill_at(x: int, at: int = 2) -> int:
    """x, except that the worker SIGKILLs itself at item ``at``."""
    if x == at:
        sigkill_self()
    return x
