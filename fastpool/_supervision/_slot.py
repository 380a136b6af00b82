"""One worker slot's record: what the supervisor knows of it (state, process,
breaker, memory, liveness readings), and the row ``worker_stats`` reports for it.

    states: empty -> starting -> ready -> (dead | backing_off | open) -> starting ...
"""

from __future__ import annotations

import select
from typing import TYPE_CHECKING, Any

from fastpool._supervision import _policy

if TYPE_CHECKING:
    from fastpool._supervision import _memory
    from fastpool._supervision._verdict import Kill


class Slot:
    """The supervisor's facts about one worker slot (states: empty, starting, ready,
    backing_off, open, dead)."""

    __slots__ = (
        "id",
        "state",
        "pid",
        "pidfd",
        "breaker",
        "spawned_at",
        "kill",
        "req",
        "cur_seen",
        "cur_since",
        "served_seen",
        "hb_seen",
        "hb_since",
        "init_error",
        "mem",
        "cg",
        "cg_text",
        "oom_before",
        "oom_last",
        "baseline",
        "via",
        "retiring",
        "start_deadline",
        "kill_pending",
        "mem_served",
        "mem_next",
        "wire_seen",
    )

    def __init__(self, sid: int, breaker: _policy.SlotBreaker) -> None:
        self.id = sid
        self.state = "empty"
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.breaker = breaker
        self.spawned_at = 0.0
        self.kill: Kill | None = None
        self.req = 0
        self.cur_seen = 0
        self.cur_since = 0.0
        self.served_seen = -1  # the dispatcher's count of its replies, last read
        self.hb_seen = -1
        self.hb_since = 0.0
        self.init_error: BaseException | None = None
        self.mem: _memory.WorkerMemory | None = None
        self.cg: dict | None = None
        self.cg_text: bytes | None = None  # /proc/<pid>/cgroup at the last resolution
        self.oom_before: int | None = None
        self.oom_last: int | None = None
        self.baseline: int | None = None
        self.via: Any = None  # the template connection that forked this slot's worker
        self.retiring = False
        self.start_deadline = 0.0
        self.kill_pending = False  # a SIGKILL decided before the worker's pidfd arrived
        self.wire_seen = 0  # the task named by the dispatcher while the worker's word is 0
        self.mem_served = -1  # the dispatcher's count of its replies at its last memory sample
        self.mem_next = 0.0  # while it runs tasks: when its next memory sample is due

    @property
    def live(self) -> bool:
        return self.state in ("starting", "ready")


def stats_row(
    slot: Slot,
    info: tuple[int, int, int, int, int],
    view: tuple[bool, bool, int, int],
    live: bool,
    now: float,
) -> dict[str, Any]:
    """The row Pool.worker_stats() reports for one slot: ``info`` is its board words
    (zeros when not live), ``view`` the dispatcher's (ready, accepting, served, assigned),
    ``live`` whether its worker is live and the board open."""
    _, accepting, served, assigned = view
    mem = slot.mem
    return dict(
        slot=slot.id,
        pid=slot.pid,
        state=slot.state,
        health="healthy" if slot.live else slot.breaker.state(now),
        failures=slot.breaker.failures,
        current_task=(info[2] >> 3) or None,
        served=served,
        assigned=assigned,
        heartbeat=info[3],
        age_s=(now - slot.spawned_at) if slot.pid else None,
        rss_bytes=mem.current_bytes if mem and live else None,
        peak_rss_bytes=mem.peak_bytes if mem else None,
        retiring=slot.retiring or not accepting,
    )


def select_read(fd: Any, timeout: float) -> bool:
    """Whether fd (a pidfd, the template connection) is readable within timeout seconds;
    True for an fd that select() refuses (closed meanwhile): the caller reads it and sees."""
    try:
        r, _, _ = select.select([fd], [], [], max(0.0, timeout))
    except (OSError, ValueError):
        return True
    return bool(r)
