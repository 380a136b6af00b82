"""Per-worker state built by an initializer, changed by tasks, read by Pool.run_on_workers.

Module level, so a worker imports it by reference: its globals are the worker's own,
shared by every task and call that worker runs.
"""

from __future__ import annotations

import os
from typing import Any

from _tasks import open_gate, touch

COUNT: dict[str, Any] = {}


def reset() -> None:
    """The initializer: a fresh worker (and each replacement) starts from zero."""
    COUNT.clear()
    COUNT.update(n=0, log=[], pid=os.getpid())


def count_item(x: int) -> int:
    COUNT["n"] += 1
    return x


def counted() -> int:
    return int(COUNT["n"])


def bump() -> int:
    """Counts a call; returns the count so far in this worker."""
    COUNT["n"] += 1
    return int(COUNT["n"])


def logged(name: str) -> str:
    COUNT["log"].append(name)
    return name


def log_so_far() -> list[str]:
    return list(COUNT["log"])


def logged_after_gate(name: str, started: str, path: str) -> str:
    """Touches ``started``, waits for the gate ``path``, then logs ``name``."""
    touch(started)
    open_gate(path)
    return logged(name)


def pid_after_gate(directory: str, path: str) -> int:
    """Announces this worker in ``directory`` (a file named by its pid), waits for the
    gate ``path``, returns its pid: a call the test can catch while it runs."""
    touch(os.path.join(directory, str(os.getpid())))
    open_gate(path)
    return os.getpid()
