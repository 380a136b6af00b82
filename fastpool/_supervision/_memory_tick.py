"""The supervisor's memory tick: which workers to sample, what a sample decides (a kill
over ``memory_limit``, a retirement past ``leak_threshold``, the cgroup OOM counter read
while the worker lives), the pause under system memory pressure, and the trim of the
parent's arena region once the pool is quiet.

Runs on the supervisor's thread only; it carries out its kills and retirements through
the Supervisor (``kill``, ``retire``) under the supervisor's lock.  The readings are
_memory's, the decisions _watch's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from fastpool._runtime._lazy import LazyModule
from fastpool._supervision import _sizing
from fastpool._supervision._slot import Slot, select_read

if TYPE_CHECKING:
    from fastpool._supervision import _memory, _watch
    from fastpool._supervision._supervisor import Supervisor
else:
    # imported at the first tick, off a first pool's path to its first result
    _memory = LazyModule("fastpool._supervision._memory")
    _watch = LazyModule("fastpool._supervision._watch")

log = logging.getLogger("fastpool")

# How long nothing is in flight and the parent takes no arena block before this thread
# trims the parent's arena region (Arena.trim: the pages of freed blocks beyond its warm
# reserve go back to the kernel).  The supervisor keeps ticking until that first trim
# (trim_waiting), whatever its IDLE_LINGER_S.  A run of calls never waits for it: only a
# pause does (docs/arrays.md, "Memory that comes back").
TRIM_QUIET_S = 0.1
# What the parent must drop of its region's blocks (a pool.share / pool.empty / arrays()
# array going, while the pool idles and this thread sleeps) to wake this thread for a
# trim: less stays warm anyway (Arena.trim's reserve is 16 MiB).
TRIM_WAKE_BYTES = 1 << 20


class MemoryTick:
    """The memory side of one Supervisor.  ``paused`` and ``last_available`` are what
    ``stats()`` reports (dispatch_paused, available_memory_bytes)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.paused = False
        self.last_available: int | None = None
        # not at once: no worker has a pid yet, and the pool's constructor waits on the
        # supervisor thread's first steps (Thread.start) while it holds the GIL
        self._next = time.monotonic() + sup.settings["memory_interval_s"]
        self._trim_seen, self._trim_quiet_since, self._trim_due = -1, 0.0, False
        self._trim_tried = False  # a trim ran since the last task or block taken
        self._freed_seen = 0  # arena.freed at the last tick: a drop since is a trim due

    def tick(self) -> None:
        """One pass of the supervisor's loop: the memory checks when they are due
        (every ``memory_interval_s``), then the parent's trim if the pool is quiet."""
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + self.sup.settings["memory_interval_s"]
            self.check()
        self._maybe_trim()

    def _maybe_trim(self) -> None:
        """Trims the parent's arena region once the pool has been quiet for TRIM_QUIET_S:
        nothing in flight and no block taken by this process (calls, share, the NumPy
        hook).  Again at later ticks while blocks of the region are live (a result or
        an array the caller still holds may be freed later)."""
        arena, now = self.sup.arena, time.monotonic()
        if self.sup.disp.inflight or arena.allocs != self._trim_seen:
            self._trim_seen, self._trim_quiet_since, self._trim_due = arena.allocs, now, True
            self._trim_tried = False
            return
        if arena.freed != self._freed_seen:  # an array of the region went since: its turn
            self._freed_seen, self._trim_due, self._trim_tried = arena.freed, True, False
        if self._trim_due and now - self._trim_quiet_since >= TRIM_QUIET_S:
            self._trim_due = bool(arena.trim()[1])
            self._trim_tried = True

    def may_sleep(self) -> bool:
        """Arms the arena's wake (Arena.wake_on_free) for the supervisor's sleep, then
        says whether it may sleep: not if the parent dropped blocks since the last tick
        (they were dropped before the arming, and woke nobody)."""
        arena = self.sup.arena
        arena.arm_wake()
        return arena.freed == self._freed_seen

    def trim_waiting(self) -> bool:
        """Whether the pool's last activity has not had its trim yet: the supervisor keeps
        its ticks until it has.  Blocks still live then (a result the caller holds) are
        trimmed again only at later ticks for other reasons: a held array must not keep
        an idle pool's thread waking."""
        return self._trim_due and not self._trim_tried

    def unsampled(self) -> bool:
        """A live worker whose memory may have changed since its last sample."""
        if self.sup.board.closed:
            return False
        for slot in self.sup.slots:
            if (
                slot.pid is not None
                and slot.live
                and slot.kill is None
                and self.may_have_grown(slot)
            ):
                return True
        return False

    def may_have_grown(self, slot: Slot) -> bool:
        """Starting (its initializer runs), holding a task, or served one since its last
        sample: an idle worker that was sampled after its last task is not sampled again."""
        return self._sample_due(slot, None) is not None

    def _sample_due(self, slot: Slot, now: float | None) -> bool | None:
        """None: nothing it owns changed since its last sample (idle since).  True: sample
        it now (new, starting, served a task since and idle now, or ``now`` is past its
        pace, _watch.sample_pace).  False: busy, and its next sample is not due yet."""
        if slot.state != "ready" or slot.mem is None or slot.mem.pid != slot.pid:
            return True
        _, _, served, assigned = self.sup.disp.slot_view(slot.id)
        if not assigned:
            return True if served != slot.mem_served else None
        return now is None or now >= slot.mem_next

    def check(self) -> None:
        """Owned memory per worker (limit, leak), its cgroup's OOM counter, and system
        pressure.  Pressure and the OOM counters are read at every check; a busy worker's
        own memory at its pace (_watch.sample_pace: every check near its memory_limit, up to
        RELAXED_S apart far from it), which keeps a check's cost from growing with the
        workers while none is near a limit."""
        now = time.monotonic()
        settings = self.sup.settings
        limit, leak = settings["memory_limit"], settings["leak_threshold"]
        counts: dict[tuple, int | None] = {}  # one reading per cgroup this tick: workers share one
        for slot in self.sup.slots:
            pid = slot.pid
            if pid is None or not slot.live or slot.kill is not None:
                continue
            due = self._sample_due(slot, now)
            if due is None:
                continue  # idle since its last sample: nothing it owns has changed
            sample = None
            if due:
                slot.mem_served = self.sup.disp.slot_view(slot.id)[2]  # before the sample
                if slot.mem is None or slot.mem.pid != pid:
                    slot.mem = _memory.WorkerMemory(slot.id, pid)
                # what it owns: private memory, plus its own arena blocks (its NumPy arrays
                # live there, through the allocator hook), never the shared data it reads
                sample = slot.mem.sample(now, self.sup.arena.held_bytes(slot.id + 1))
                if sample is None or sample.total_rss_bytes == 0:  # dying: see oom_baseline
                    continue
                slot.mem_next = now + _watch.sample_pace(
                    sample.rss_bytes, limit, settings["memory_interval_s"]
                )
                # A worker (or its task) may move itself to another cgroup: follow it at
                # each sample, and read that cgroup's OOM counter at every check while the
                # worker is alive, so that after a SIGKILL we compare the same cgroup's
                # counter before and after.
                where = _sizing.read_bytes_or_none(f"/proc/{pid}/cgroup")
                if where != slot.cg_text or slot.cg is None:  # resolving costs ~100 us
                    slot.cg_text = where
                    slot.cg = _memory.cgroup_of(pid)
                    slot.oom_before = slot.oom_last = None  # another cgroup: another counter
            if slot.cg is None:
                continue
            key = (slot.cg.get("v2"), slot.cg.get("v1_memory"))
            if key not in counts:
                counts[key] = _memory.oom_kill_count(slot.cg)
            count = counts[key]
            if slot.pidfd is not None and not select_read(slot.pidfd, 0):
                # a reading may already count this worker's own kill: see oom_baseline
                slot.oom_before = _memory.oom_baseline(slot.oom_before, slot.oom_last, count)
                slot.oom_last = count
            if sample is None:
                continue  # the rest decides on a new sample
            if _watch.over_memory_limit(sample.rss_bytes, limit):
                cur = self.sup.board.current(slot.id) if slot.state == "ready" else 0
                with self.sup.lock:
                    if slot.kill is None:
                        self.sup.kill(slot, _watch.memory_kill(sample.rss_bytes, limit, cur))
                continue
            served = self.sup.disp.slot_view(slot.id)[2]
            if served >= 1 and slot.baseline is None:
                slot.baseline = sample.rss_bytes  # after the first task: imports and caches are in
            if (
                leak
                and slot.baseline is not None
                and not slot.retiring
                and _memory.leaked(slot.baseline, sample.rss_bytes, leak)
            ):
                with self.sup.lock:
                    slot.retiring = True
                    if self.sup.disp.set_accepting(slot.id, False):
                        self.sup.retire(slot)
        self._check_pressure()

    def _check_pressure(self) -> None:
        floor = self.sup.settings["min_available"]
        if floor is None:
            return
        try:
            if isinstance(floor, float):  # a fraction: resolved here, off a first result's path
                floor = self.sup.settings["min_available"] = _sizing.memory_bytes(floor)
            avail = self.sup.settings["available_memory"]()
        except Exception:  # noqa: BLE001 - a reading we cannot take pauses nothing
            return
        self.last_available = avail
        paused = _watch.paused_by_pressure(avail, floor)
        if paused != self.paused:
            # the dispatcher first: stats() reports self.paused, and whoever reads
            # "paused" there must find dispatch paused already
            self.sup.disp.set_paused(paused)
            self.paused = paused
            if paused:
                self.sup.tel.count("paused")
                log.warning(
                    "fastpool: available memory %d MiB is below %d MiB; dispatch paused",
                    avail >> 20,
                    floor >> 20,
                )
            else:
                log.warning(
                    "fastpool: memory is back (%d MiB available); dispatch resumed", avail >> 20
                )
