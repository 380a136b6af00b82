"""Worker memory: RSS sampling, and evidence for blaming a SIGKILL on the OOM killer.

A worker that dies of SIGKILL the pool did not send was most likely killed by
the kernel's OOM killer, but "most likely" is not enough for a crash record.
The kernel counts its kills: cgroup v2 ``memory.events`` ``oom_kill``, cgroup v1
``memory.oom_control`` ``oom_kill`` (kernels >= 4.13), and system-wide
``/proc/vmstat`` ``oom_kill``. Read a counter before (at spawn) and after (once
the worker is reaped); a rise is the evidence ``judge_sigkill`` turns into a
verdict and a sentence.

    spawn:  cg = cgroup_of(pid); before = oom_kill_count(cg)
    run:    WorkerMemory.sample(now) every tick -> current/peak RSS, over_limit()
    SIGKILL we did not send: after = oom_kill_count(cg)
            judge_sigkill(before, after, wm.current_bytes, limit, sent_by_pool=False)

Cost of one sample, measured on this machine (Intel Xeon, 2 CPUs, Python 3.11.7,
psutil 7.2.2, Linux 6.18, 20 000 calls with ``timeit`` against a live child):

    psutil.Process(pid).memory_info().rss     ~22-24 us  (builds a Process each time)
    proc.memory_info().rss, proc kept          ~8.5-9 us  (the fallback off Linux)
    read /proc/<pid>/statm directly            ~5.5 us   (what WorkerMemory does on Linux)

so sampling 64 workers every 100 ms costs ~0.4 ms of supervisor time a second.
The statm reading is also what psutil reads on Linux; reading it here spares the
import of psutil (15-30 ms), which the first memory tick of a first pool paid on
the supervisor thread, holding the GIL while the first task was being submitted.

The ``root`` arguments (default ``/``) prefix every /proc and /sys path, for
tests. Readers return None rather than raise when a file is missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fastpool import _sizing
from fastpool._lazy import psutil  # only where /proc/<pid>/statm is missing (not Linux)

__all__ = [
    "rss_bytes",
    "cgroup_of",
    "oom_kill_count",
    "limit_hit_count",
    "system_oom_kill_count",
    "OomEvidence",
    "judge_sigkill",
    "MemorySample",
    "WorkerMemory",
    "leaked",
    "NEAR_LIMIT_FRACTION",
]

# An RSS this close to the limit when the worker vanished makes an OOM kill
# likely; without a counter that rose it is still only a guess.
NEAR_LIMIT_FRACTION = 0.9


# Decided once: /proc either is there or is not.
_STATM = os.path.exists("/proc/self/statm")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if _STATM else 0


def _statm_rss(pid: int) -> int | None:
    """``pid``'s resident pages from /proc/<pid>/statm, in bytes; None if it is gone or a zombie."""
    try:
        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    except OSError:
        return None
    try:
        pages = int(os.read(fd, 256).split()[1])  # "size resident shared text lib data dt"
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)
    # A zombie (dead, not reaped yet) has released its memory and reads all zeros.
    return pages * _PAGE_BYTES if pages else None


def _psutil_rss(proc: psutil.Process) -> int | None:
    try:
        return int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        # ZombieProcess is a NoSuchProcess: a dead worker not yet reaped has no RSS.
        return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes; None if it is gone, a zombie, or not ours to read."""
    if _STATM:
        return _statm_rss(pid)
    try:
        proc = psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return _psutil_rss(proc)


def cgroup_of(pid: int | str = "self", root: _sizing.StrPath = "/") -> dict[str, Path | None]:
    """The memory cgroup directories of ``pid``: ``{"v2": Path | None, "v1_memory": Path | None}``.

    ``v2`` is the process's cgroup2 directory when a cgroup2 tree is mounted
    (on a hybrid host it may carry no memory files), ``v1_memory`` its v1
    memory-controller directory. Both None off Linux or when the pid is gone.
    """
    found: dict[str, Path | None] = {"v2": None, "v1_memory": None}
    for cg in _sizing.find_cgroups("memory", pid, root):
        found["v2" if cg.version == 2 else "v1_memory"] = cg.path
    return found


def _field(path: Path | None, key: str) -> int | None:
    if path is None:
        return None
    return _sizing.stat_field(_sizing.read_or_none(path), key)


def oom_kill_count(cg: dict[str, Path | None]) -> int | None:
    """How many processes in the cgroup the OOM killer has killed; None if no counter is readable.

    v2 ``memory.events`` ``oom_kill`` first, then v1 ``memory.oom_control``
    ``oom_kill`` (absent before Linux 4.13, hence None). Both count the kills of
    the cgroup's processes by any OOM killer, the global one included.
    """
    v2 = cg.get("v2")
    count = _field(v2 / "memory.events" if v2 is not None else None, "oom_kill")
    if count is not None:
        return count
    v1 = cg.get("v1_memory")
    return _field(v1 / "memory.oom_control" if v1 is not None else None, "oom_kill")


def limit_hit_count(cg: dict[str, Path | None]) -> int | None:
    """How often the cgroup's memory usage hit its limit; None if no counter is readable.

    v2 ``memory.events`` ``max``, v1 ``memory.failcnt``. A rise without an OOM
    kill means the kernel reclaimed and went on.
    """
    v2 = cg.get("v2")
    count = _field(v2 / "memory.events" if v2 is not None else None, "max")
    if count is not None:
        return count
    v1 = cg.get("v1_memory")
    if v1 is None:
        return None
    return _sizing.int_or_none(_sizing.read_or_none(v1 / "memory.failcnt"))


def system_oom_kill_count(root: _sizing.StrPath = "/") -> int | None:
    """OOM kills on the whole machine since boot (``/proc/vmstat`` ``oom_kill``); None if unreadable.

    Weaker evidence than the cgroup counter: another process's kill raises it too.
    """
    return _field(Path(root) / "proc" / "vmstat", "oom_kill")


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


def _rss_clause(last_rss: int | None, limit: int | None) -> str:
    if limit:
        pct = "" if last_rss is None else f" ({100 * last_rss / limit:.0f}%)"
        return f"last RSS {_mib(last_rss)} of a {_mib(limit)} limit{pct}"
    return f"last RSS {_mib(last_rss)}, no memory limit known"


def judge_sigkill(
    before_count: int | None,
    after_count: int | None,
    last_rss: int | None,
    limit: int | None,
    sent_by_pool: bool,
    *,
    scope: str = "cgroup",
) -> tuple[bool, str]:
    """Whether a worker's SIGKILL is confirmed as an OOM kill, and one line saying why.

    Confirmed only when the pool did not send the signal and an OOM-kill
    counter (``scope`` names which: ``"cgroup"`` or ``"system"``) rose between
    ``before_count`` and ``after_count``. An RSS near ``limit`` without a
    counter makes the line say "likely", never confirmed. Read
    ``after_count`` after reaping the worker: the kernel bumps the counter
    just after it sends the signal. Never raises.
    """
    rss = _rss_clause(last_rss, limit)
    if sent_by_pool:
        return (False, f"fastpool sent this SIGKILL itself (timeout, hang or memory limit); {rss}")
    if before_count is not None and after_count is not None:
        if after_count > before_count:
            return (
                True,
                f"the {scope} OOM-kill counter rose from {before_count} to {after_count} while the "
                f"worker died: the kernel's OOM killer; {rss}",
            )
        if after_count == before_count:
            return (
                False,
                f"the {scope} OOM-kill counter stayed at {before_count}, so the SIGKILL came from "
                f"outside (a user, a job scheduler, a container runtime), not the OOM killer; {rss}",
            )
        return (
            False,
            f"the {scope} OOM-kill counter went down from {before_count} to {after_count} (the "
            f"cgroup was recreated?), so it proves nothing; {rss}",
        )
    near = limit is not None and last_rss is not None and last_rss >= NEAR_LIMIT_FRACTION * limit
    verdict = "an OOM kill is likely but unconfirmed" if near else "the sender is unknown"
    return (False, f"no OOM-kill counter could be read, {verdict}; {rss}")


@dataclass(frozen=True)
class OomEvidence:
    """What was known about a SIGKILL'd worker; ``judge()`` gives the verdict and the sentence."""

    before_count: int | None
    after_count: int | None
    last_rss_bytes: int | None
    limit_bytes: int | None
    sent_by_pool: bool
    scope: str = "cgroup"  # which counter: "cgroup" (memory.events / oom_control) or "system" (vmstat)

    def judge(self) -> tuple[bool, str]:
        """``judge_sigkill`` on these facts."""
        return judge_sigkill(
            self.before_count,
            self.after_count,
            self.last_rss_bytes,
            self.limit_bytes,
            self.sent_by_pool,
            scope=self.scope,
        )


@dataclass(frozen=True)
class MemorySample:
    """One RSS reading of one process at ``at`` (the caller's clock, seconds)."""

    pid: int
    rss_bytes: int
    at: float


@dataclass
class WorkerMemory:
    """Current, peak and baseline RSS of one worker process.

    ``baseline_bytes`` is the first reading (a worker that has imported its
    modules), the reference for ``leaked``. Stop sampling once the worker is
    reaped: neither /proc/<pid> nor the ``psutil.Process`` kept off Linux
    notices the pid being reused. Not thread-safe: the supervisor thread owns it.
    """

    worker_id: int
    pid: int
    current_bytes: int = 0
    peak_bytes: int = 0
    baseline_bytes: int | None = None
    samples: int = 0
    last_at: float | None = None
    _proc: psutil.Process | None = field(default=None, repr=False, compare=False)

    def record(self, rss: int, now: float) -> MemorySample:
        """Take in a reading made elsewhere (or in a test); returns it as a sample."""
        self.current_bytes = rss
        self.peak_bytes = max(self.peak_bytes, rss)
        if self.baseline_bytes is None:
            self.baseline_bytes = rss
        self.samples += 1
        self.last_at = now
        return MemorySample(self.pid, rss, now)

    def sample(self, now: float) -> MemorySample | None:
        """Read the worker's RSS now and record it; None (nothing recorded) if it is gone."""
        if _STATM:
            rss = _statm_rss(self.pid)
        else:
            if self._proc is None:
                try:
                    # Kept: building a Process costs ~2.5x the reading itself.
                    self._proc = psutil.Process(self.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    return None
            rss = _psutil_rss(self._proc)
        return None if rss is None else self.record(rss, now)

    def over_limit(self, limit: int | None) -> bool:
        """Whether the last reading is above ``limit`` bytes; never with no limit."""
        return limit is not None and self.current_bytes > limit


def leaked(baseline: int | None, current: int | None, threshold: int) -> bool:
    """Whether RSS grew by more than ``threshold`` bytes over ``baseline``; False if either is unknown.

    The caller should measure ``current`` between tasks (and, if it can, after
    a ``gc.collect()`` in the worker), or one big task's working set reads as a leak.
    """
    if baseline is None or current is None:
        return False
    return current - baseline > threshold
