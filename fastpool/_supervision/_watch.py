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
