"""Parent-side helpers of the joblib backend's tests (tests/joblib/)."""

from __future__ import annotations

import time
from typing import Callable

import psutil

LEAK_GRACE_S = 5.0


def workers_alive() -> set[int]:
    """This process's descendants, less fastpool's template (it lives as long as we do)."""
    from fastpool._runtime import _template

    keep = {_template.template().pid}
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in keep and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_until(predicate: Callable[[], bool], limit_s: float = LEAK_GRACE_S) -> bool:
    """Polls ``predicate`` until it holds (True) or ``limit_s`` passes (False)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
