"""What a pool tells about itself: ``stats()``, crash records, percentiles, and
the ``fastpool`` logger.

Counts come from two rooms: the dispatcher counts what happened to tasks
(submitted, completed, failed, cancelled, for calls and map chunks apart);
supervision counts what happened to workers (crashes, fastpool's own kills,
restarts, recycling, pauses).  ``Telemetry`` keeps the second set and the
crash records, and puts both together on request.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

log = logging.getLogger("fastpool")

SUPERVISION_COUNTERS = (
    "crashed",
    "killed",
    "restarts",
    "recycled",
    "paused",
    "corrupt",
    "spawn_failures",
)
MAX_CRASH_RECORDS = 256


class Telemetry:
    """Supervision counters and the last crash records.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(SUPERVISION_COUNTERS, 0)
        self._crashes: deque[dict[str, Any]] = deque(maxlen=MAX_CRASH_RECORDS)

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def crash(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._crashes.append(record)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def crashes(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._crashes)


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99/max in microseconds, and n."""
    if not samples_ns:
        return {}
    s = sorted(samples_ns)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] / 1000, 1)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0), "n": len(s)}
