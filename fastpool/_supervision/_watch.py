"""Whether a live worker must be stopped, and why: task timeouts, heartbeats, its
memory, and the system's available memory.

Functions of the readings the Supervisor took (no process, no lock, no slot state): each
returns a decision (a ``Kill`` with its cause, or a change of state), and the Supervisor
carries it out.
"""

from __future__ import annotations

from typing import Any

from fastpool._supervision._verdict import Cause, Kill


def task_limit(task: Any, task_timeout: float | None) -> float | None:
    """The timeout that applies to the running task: its own, else the pool's."""
    if task is not None and task.options and task.options.timeout:
        return task.options.timeout
    return task_timeout


def liveness_kill(
    now: float,
    cur: int,
    cur_since: float,
    hb_since: float,
    limit: float | None,
    hang_timeout: float | None,
) -> Kill | None:
    """A worker running task ``cur`` since ``cur_since``, last heartbeat at ``hb_since``:
    killed for its task's timeout first, else for a missing heartbeat; None if neither.

    A heartbeat is missing only from when the task was first seen: an idle worker's
    heartbeat thread sleeps, and beats again once the worker takes a task."""
    if limit and now - cur_since > limit:
        return Kill(Cause.TIMEOUT, cur, f"{limit:g}")
    silent_since = max(hb_since, cur_since)
    if hang_timeout and now - silent_since > hang_timeout:
        return Kill(
            Cause.HUNG,
            cur,
            f"no heartbeat for {now - silent_since:.1f} s (hang_timeout={hang_timeout:g} s)",
        )
    return None


# How fast a worker's memory can grow, at most, for the time one may go unsampled: page
# faults on fresh anonymous memory ran at 0.7 GiB/s on this project's VM, and run at a few
# GiB/s per core on bare metal, more with transparent huge pages.
GROWTH_BPS = 16 << 30
# A busy worker far from its memory_limit, or with none, is sampled this often: its stats
# row and leak_threshold wait no longer than this for a reading.
RELAXED_S = 1.0


def sample_pace(owned: int, limit: int | None, interval_s: float) -> float:
    """Seconds until a busy worker owning ``owned`` bytes needs its next memory sample: the
    time its memory would take to reach ``limit`` at GROWTH_BPS, within ``interval_s``
    (memory_interval_s) and RELAXED_S (or ``interval_s`` if that is longer)."""
    relaxed = max(interval_s, RELAXED_S)
    if limit is None:
        return relaxed
    return min(relaxed, max(interval_s, (limit - owned) / GROWTH_BPS))


def over_memory_limit(owned: int, limit: int | None) -> bool:
    """Whether a worker owning ``owned`` bytes is over ``limit``; never with no limit."""
    return limit is not None and 0 < limit < owned


def memory_kill(owned: int, limit: int, cur: int) -> Kill:
    """The kill for a worker over its memory limit (its running task ``cur``, if any, is
    judged by it)."""
    return Kill(
        Cause.MEMORY,
        cur or None,
        f"{owned / 2**20:.1f} MiB, over memory_limit {limit / 2**20:.1f} MiB",
    )


def paused_by_pressure(available: int, floor: int) -> bool:
    """Dispatch pauses while available memory is below ``floor`` bytes."""
    return available < floor
