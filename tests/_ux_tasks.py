"""Tasks for the progress and asyncio tests, importable by name in workers.

"Started" and "may finish" are files, not sleeps: a task touches ``started``
when it runs and holds its worker until ``gate`` exists, so a test knows a
task is running (or still queued) as a fact.  Every wait has a limit, so a
failed test never strands a worker.
"""

from __future__ import annotations

import os
import time
from typing import Any

LIMIT_S = 30.0


def _wait(path: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.005)


def held_first(x: int, gate: str) -> int:
    """x * 2; item 0 waits for ``gate`` first (an ordered map's head chunk held)."""
    if x == 0:
        _wait(gate, LIMIT_S)
    return x * 2


def gated(value: Any, started: str, gate: str) -> Any:
    """Touches ``started``, waits for ``gate``, returns value."""
    with open(started, "w"):
        pass
    _wait(gate, LIMIT_S)
    return value


def touch(path: str) -> str:
    """Leaves a trace: the task ran."""
    with open(path, "w"):
        pass
    return path


def cooperative(started: str) -> str:
    """Touches ``started``, then runs until fastpool.cancelled() says stop."""
    import fastpool

    with open(started, "w"):
        pass
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline:
        if fastpool.cancelled():
            return "stopped early"
        time.sleep(0.005)
    return "ran to the end"


def first_free(x: int, gate: str) -> int:
    """x * 2 at once for item 0; every other item waits for ``gate`` first."""
    if x != 0:
        _wait(gate, LIMIT_S)
    return x * 2


def where() -> tuple[int, int]:
    """(pid, thread id) of the caller: which process and thread ran the task."""
    import threading

    return os.getpid(), threading.get_ident()


def bad_initializer() -> None:
    raise RuntimeError("initializer is broken")
