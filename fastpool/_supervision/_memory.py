"""Worker memory: what a worker owns, sampled from /proc, and evidence for blaming a
SIGKILL on the OOM killer.

What a worker owns
------------------
``memory_limit`` and ``leak_threshold`` compare the memory a worker *owns*:
its resident set less the shared memory it has mapped,

    owned = VmRSS - RssShmem        (from /proc/<pid>/status; == RssAnon + RssFile)

not plain RSS, which also counts every page of shared memory the worker has
touched: a worker that merely sums a 2 GiB shared array would read as 2 GiB and
be killed under a 1 GiB limit. The kernel computes VmRSS as the sum of RssAnon,
RssFile and RssShmem, so the two spellings are the same number; VmRSS less
RssShmem is read because VmRSS exists on every Linux, and on a kernel older than
4.5 (no Rss* lines) the same code falls back to plain RSS instead of to nothing.
USS (psutil ``memory_full_info``) was not taken: it walks every mapping in
``smaps``, milliseconds for a large worker, every tick, for every worker.

What that means for arrays in the arena (a memfd, so shmem):

- shared arrays a task reads or writes (``pool.share``/``zeros``/``empty``,
  plain arrays the parent copied into the arena to send, shared initargs) never
  count, however much of them the task touches;
- a task's result counts while it is built in private memory (``np.ones``,
  arithmetic) and stops counting once it is copied into an arena block to be
  returned; a task that writes its output into a shared array the parent passed
  in is not bounded by ``memory_limit`` at all: ``arena_bytes`` bounds that;
- RssFile still counts: shared libraries (in the baseline) and pages of files
  the task maps (``np.memmap``), which the kernel could reclaim.

The kernel's own cgroup limit is not fooled either way: memcg charges a shmem
page to the cgroup of the process that first touched it, so a real OOM kill is
still explained by the counters below.

OOM evidence
------------
A worker that dies of SIGKILL the pool did not send was most likely killed by
the kernel's OOM killer, but "most likely" is not enough for a crash record.
The kernel counts its kills: cgroup v2 ``memory.events`` ``oom_kill``, cgroup v1
``memory.oom_control`` ``oom_kill`` (kernels >= 4.13), and system-wide
``/proc/vmstat`` ``oom_kill``. Read a counter before (at spawn) and after (once
the worker is reaped); a rise is the evidence ``judge_sigkill`` turns into a
verdict and a sentence.

    spawn:  cg = cgroup_of(pid); before = oom_kill_count(cg)
    run:    WorkerMemory.sample(now) every tick -> current/peak owned bytes, over_limit()
    SIGKILL we did not send: after = oom_kill_count(cg)
            judge_sigkill(before, after, wm.current_bytes, limit, sent_by_pool=False)

Cost of one sample against a live child (Xeon, 2 shared CPUs, Python 3.11, Linux
6.18, best of 5 x 5000 calls with ``timeit``):

    read_memory(pid): os.open/read/close /proc/<pid>/status   ~15 us
    psutil Process kept, .memory_info().rss (the old reading)   ~16-18 us  (RSS only)

so sampling 64 workers every 100 ms costs ~1 ms of supervisor time a second.

The ``root`` arguments (default ``/``) prefix every /proc and /sys path, for
tests. Readers return None rather than raise when a file is missing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

from fastpool._runtime._lazy import (
    psutil,
)  # imported at the first sample: keeps `import fastpool` fast
from fastpool._supervision import _sizing

__all__ = [
    "ProcessMemory",
    "parse_status",
    "read_memory",
    "rss_bytes",
    "owned_bytes",
    "cgroup_of",
    "oom_kill_count",
    "limit_hit_count",
    "system_oom_kill_count",
    "OomEvidence",
    "judge_sigkill",
    "oom_baseline",
    "MemorySample",
    "WorkerMemory",
    "leaked",
    "NEAR_LIMIT_FRACTION",
]

# Owned memory this close to the limit when the worker vanished makes an OOM kill
# likely; without a counter that rose it is still only a guess.
NEAR_LIMIT_FRACTION = 0.9


class ProcessMemory(NamedTuple):
    """One reading of a process's resident memory, in bytes (see the module docstring).

    ``anon_bytes``, ``file_bytes`` and ``shmem_bytes`` are None where the kernel
    (< 4.5) or the platform does not split RSS; ``owned_bytes`` is then all of RSS.
    """

    rss_bytes: int
    anon_bytes: int | None = None
    file_bytes: int | None = None
    shmem_bytes: int | None = None

    @property
    def owned_bytes(self) -> int:
        """RSS less the shared memory mapped: what ``memory_limit`` and ``leak_threshold``
        compare."""
        return self.rss_bytes - (self.shmem_bytes or 0)


_STATUS_KEYS = {
    b"VmRSS:": "rss_bytes",
    b"RssAnon:": "anon_bytes",
    b"RssFile:": "file_bytes",
    b"RssShmem:": "shmem_bytes",
}


def parse_status(text: str | bytes) -> ProcessMemory | None:
    """The memory lines of a ``/proc/<pid>/status`` text; None without VmRSS (a zombie, a
    kernel thread)."""
    data = text.encode() if isinstance(text, str) else text
    # Four keys looked up by position, not every line split: the supervisor parses each
    # live worker's status every memory_interval_s (a status text is ~55 lines).
    found: dict[str, int] = {}
    for key, name in _STATUS_KEYS.items():
        at = data.find(key)
        while at > 0 and data[at - 1] != 0x0A:  # "VmRSS:" only at a line's start
            at = data.find(key, at + 1)
        if at < 0:
            continue
        end = data.find(b"\n", at)
        parts = data[at + len(key) : end if end >= 0 else len(data)].split()
        try:
            found[name] = int(parts[0]) * (1024 if parts[1:2] == [b"kB"] else 1)
        except (IndexError, ValueError):
            continue
    if "rss_bytes" not in found:
        return None
    return ProcessMemory(**found)


_HAVE_PROC = sys.platform.startswith("linux")


def read_memory(pid: int | str = "self", root: _sizing.StrPath = "/") -> ProcessMemory | None:
    """``pid``'s resident memory now; None if it is gone, a zombie, or not ours to read.

    Linux: ``<root>/proc/<pid>/status``. Elsewhere (root ``/`` only): psutil's
    RSS, with no split, so everything resident counts as owned.
    """
    if _HAVE_PROC or str(root) != "/":
        data = _sizing.read_bytes_or_none(os.path.join(os.fspath(root), "proc", str(pid), "status"))
        return parse_status(data) if data is not None else None
    try:
        proc = psutil.Process() if pid == "self" else psutil.Process(int(pid))
        return ProcessMemory(rss_bytes=int(proc.memory_info().rss))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        # ZombieProcess is a NoSuchProcess: a dead worker not yet reaped has no RSS.
        return None


def rss_bytes(pid: int | str = "self", root: _sizing.StrPath = "/") -> int | None:
    """Resident set size of ``pid`` in bytes, shared memory included; None if it is gone."""
    mem = read_memory(pid, root)
    return mem.rss_bytes if mem is not None else None


def owned_bytes(pid: int | str = "self", root: _sizing.StrPath = "/") -> int | None:
    """What ``pid`` owns: RSS less the shared memory it maps (``ProcessMemory.owned_bytes``)."""
    mem = read_memory(pid, root)
    return mem.owned_bytes if mem is not None else None


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
    """OOM kills on the whole machine since boot (``/proc/vmstat`` ``oom_kill``); None if
    unreadable.

    Weaker evidence than the cgroup counter: another process's kill raises it too.
    """
    return _field(Path(root) / "proc" / "vmstat", "oom_kill")


def oom_baseline(before: int | None, previous: int | None, count: int | None) -> int | None:
    """The OOM-kill count a later SIGKILL is judged against, given a new reading made while
    the worker lived.

    ``before`` is the baseline so far, ``previous`` the reading one tick earlier,
    ``count`` this tick's. A reading replaces the baseline only when it repeats
    the previous one (or when there is no baseline yet): the kernel bumps the
    counter as it sends the SIGKILL, and the victim can stay alive a while
    longer freeing its memory, so one reading may already count the worker's
    own kill, which would then read as "the counter stayed" after its death.
    """
    if count is not None and (before is None or count == previous):
        return count
    return before


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


def _rss_clause(last_rss: int | None, limit: int | None) -> str:
    owned = f"last owned memory (RSS less shared) {_mib(last_rss)}"
    if limit:
        pct = "" if last_rss is None else f" ({100 * last_rss / limit:.0f}%)"
        return f"{owned} of a {_mib(limit)} limit{pct}"
    return f"{owned}, no memory limit known"


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
    ``before_count`` and ``after_count``. ``last_rss`` is the worker's last
    owned memory (``WorkerMemory.current_bytes``); near ``limit`` without a
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
                "outside (a user, a job scheduler, a container runtime), not the OOM killer; "
                f"{rss}",
            )
        return (
            False,
            f"the {scope} OOM-kill counter went down from {before_count} to {after_count} (the "
            f"cgroup was recreated?), so it proves nothing; {rss}",
        )
    near = limit is not None and last_rss is not None and last_rss >= NEAR_LIMIT_FRACTION * limit
    verdict = "an OOM kill is likely but unconfirmed" if near else "the sender is unknown"
    return (False, f"no OOM-kill counter could be read, {verdict}; {rss}")


class OomEvidence(NamedTuple):
    """What was known about a SIGKILL'd worker; ``judge()`` gives the verdict and the sentence."""

    before_count: int | None
    after_count: int | None
    last_rss_bytes: int | None
    limit_bytes: int | None
    sent_by_pool: bool
    scope: str = (
        "cgroup"  # which counter: "cgroup" (memory.events / oom_control) or "system" (vmstat)
    )

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


class MemorySample(NamedTuple):
    """One reading of one process at ``at`` (the caller's clock, seconds).

    ``owned_bytes`` is the figure limits compare; ``total_rss_bytes`` and
    ``shmem_bytes`` say where it came from (None when recorded without them).
    """

    pid: int
    owned_bytes: int
    at: float
    total_rss_bytes: int | None = None
    shmem_bytes: int | None = None

    @property
    def rss_bytes(self) -> int:
        """``owned_bytes`` under the name pool.py compares against ``memory_limit``.

        Kept so callers written against plain RSS compare the owned figure
        without a change; new code reads ``owned_bytes``.
        """
        return self.owned_bytes


class WorkerMemory:
    """Current, peak and baseline owned memory of one worker process (RSS less shared memory).

    ``current_bytes``, ``peak_bytes`` and ``baseline_bytes`` are owned bytes;
    ``baseline_bytes`` is the first reading (a worker that has imported its
    modules), the reference for ``leaked``. ``total_rss_bytes`` and
    ``shmem_bytes`` keep the last reading's total and shared parts, for reports. Stop sampling
    once the worker is reaped: /proc/<pid> does not notice its pid being
    reused. Not thread-safe: the supervisor thread owns it.
    """

    __slots__ = (
        "worker_id",
        "pid",
        "current_bytes",
        "peak_bytes",
        "baseline_bytes",
        "samples",
        "last_at",
        "total_rss_bytes",
        "shmem_bytes",
        "root",
    )

    def __init__(self, worker_id: int, pid: int, *, root: _sizing.StrPath = "/") -> None:
        self.worker_id, self.pid, self.root = worker_id, pid, root
        self.current_bytes = self.peak_bytes = self.samples = 0
        self.baseline_bytes: int | None = None
        self.last_at: float | None = None
        self.total_rss_bytes: int | None = None
        self.shmem_bytes: int | None = None

    def __repr__(self) -> str:
        return (
            f"WorkerMemory(worker_id={self.worker_id}, pid={self.pid}, "
            f"current_bytes={self.current_bytes}, peak_bytes={self.peak_bytes}, "
            f"baseline_bytes={self.baseline_bytes}, samples={self.samples})"
        )

    def record(
        self, owned: int, now: float, *, rss: int | None = None, shmem: int | None = None
    ) -> MemorySample:
        """Take in a reading made elsewhere (or in a test); returns it as a sample."""
        self.current_bytes = owned
        self.peak_bytes = max(self.peak_bytes, owned)
        if self.baseline_bytes is None:
            self.baseline_bytes = owned
        self.total_rss_bytes, self.shmem_bytes = rss, shmem
        self.samples += 1
        self.last_at = now
        return MemorySample(self.pid, owned, now, rss, shmem)

    def sample(self, now: float, arena_bytes: int = 0) -> MemorySample | None:
        """Read what the worker owns now and record it; None (nothing recorded) if it is gone.

        ``arena_bytes``: shared memory that is the worker's own all the same (the
        blocks of its arena region it allocated and still holds: its NumPy arrays,
        which fastpool's allocator places in shared memory), added to what it owns."""
        mem = read_memory(self.pid, self.root)
        if mem is None:
            return None
        return self.record(
            mem.owned_bytes + arena_bytes, now, rss=mem.rss_bytes, shmem=mem.shmem_bytes
        )

    def over_limit(self, limit: int | None) -> bool:
        """Whether the last reading is above ``limit`` bytes; never with no limit."""
        return limit is not None and self.current_bytes > limit


def leaked(baseline: int | None, current: int | None, threshold: int) -> bool:
    """Whether owned memory grew by more than ``threshold`` bytes over ``baseline``; False if
    either is unknown.

    The caller should measure ``current`` between tasks (and, if it can, after
    a ``gc.collect()`` in the worker), or one big task's working set reads as a leak.
    """
    if baseline is None or current is None:
        return False
    return current - baseline > threshold
