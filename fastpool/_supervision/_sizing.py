"""How many workers, how much memory, how many BLAS threads: sized to this process's share.

A container sees the host's CPUs and RAM through ``os.cpu_count()`` and
/proc/meminfo, but the kernel holds it to its cgroup's CPU quota and
memory limit: size by those, or a 2-CPU container on a 64-core host starts 64
workers that each run 64 BLAS threads.

    /proc/<pid>/cgroup     which cgroup:   "4:memory:/a/b", "0::/a/b"
    /proc/<pid>/mountinfo  where mounted:  cgroup2 at /sys/fs/cgroup (or .../unified),
                                           cgroup v1 at /sys/fs/cgroup/<controller>
    <mount>/<path>/...     limits:         cpu.max | cpu.cfs_quota_us + cpu.cfs_period_us,
                                           memory.max | memory.limit_in_bytes
    /proc/meminfo          the host's:     MemTotal, MemAvailable (psutil where it is missing)

Limits are read at every level from the process's cgroup up to the mount point
and the smallest wins, because a parent's limit binds its children while the
child's own file may say "max". Both hierarchies are read on hybrid hosts (this
one mounts v1 controllers and a v2 ``unified`` tree); a controller lives in only
one of them, so the other has no file and adds nothing.

Every reader degrades rather than raises: off Linux, with no /proc, or with a
file missing, unreadable or in a format it does not know, the limit counts as
absent. The ``root`` argument (default ``/``) prefixes every /proc and /sys path,
so tests build a fake tree under a temporary directory.

Thread-safe: nothing here keeps state; every call reads the files again.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from fastpool._runtime._blas import BLAS_THREAD_VARS
from fastpool._runtime._lazy import psutil  # only where /proc/meminfo is missing (not Linux)

__all__ = [
    "CgroupDir",
    "Mount",
    "parse_proc_cgroup",
    "parse_mountinfo",
    "find_cgroups",
    "cpu_quota",
    "usable_cpus",
    "memory_limit_bytes",
    "cgroup_memory_headroom_bytes",
    "total_memory_bytes",
    "available_memory_bytes",
    "AvailableMemory",
    "meminfo_bytes",
    "parse_memory",
    "check_memory",
    "memory_bytes",
    "default_workers",
    "blas_thread_env",
    "threads_per_worker",
    "BLAS_THREAD_VARS",
    "StrPath",
    "read_or_none",
    "read_bytes_or_none",
    "int_or_none",
    "stat_field",
]

StrPath = str | os.PathLike[str]

# v1 writes "no limit" as PAGE_COUNTER_MAX pages, 9223372036854771712 on 4 KiB
# pages and other near-2**63 values on other page sizes; no real limit is 1 EiB.
V1_UNLIMITED_BYTES = 2**60


class Mount(NamedTuple):
    """One line of /proc/<pid>/mountinfo, the fields cgroup lookup needs."""

    root: str  # the path inside the hierarchy that is mounted at mount_point
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]  # v1 names its controllers here: ("rw", "cpu", "cpuacct")


class CgroupDir(NamedTuple):
    """A process's cgroup directory in one hierarchy, and the top of that hierarchy."""

    version: int  # 1 or 2
    path: Path  # on disk, under root
    mount: Path  # on disk, under root; walks up stop here

    def levels(self) -> list[Path]:
        """``path``, then each parent up to and including ``mount``."""
        out = [self.path]
        here = self.path
        while here != self.mount and here.parent != here:
            here = here.parent
            out.append(here)
        return out


def read_bytes_or_none(path: StrPath) -> bytes | None:
    """The bytes of ``path``; None if it is missing or unreadable (a directory, a process
    gone between the open and the read: ESRCH)."""
    # os.open/read: no buffered file object to build, the cheapest read Python has; the
    # supervisor reads /proc and cgroup files every memory_interval_s
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_or_none(path: StrPath) -> str | None:
    """The text of ``path``; None if it is missing, unreadable or not text."""
    data = read_bytes_or_none(path)
    if data is None:
        return None  # gone, unreadable, or not a file: a missing limit, not an error
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def int_or_none(text: str | None) -> int | None:
    """``text`` as an int, surrounding whitespace ignored; None for None or non-integers."""
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def stat_field(text: str | None, key: str) -> int | None:
    """Field ``key`` of a flat-keyed file like memory.stat or memory.events."""
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int_or_none(parts[1])
    return None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Parse /proc/<pid>/cgroup into {controller: cgroup path}; the v2 entry's key is ``""``.

    ``"4:memory:/a"`` gives ``{"memory": "/a"}``; ``"1:cpu,cpuacct:/a"`` gives both
    names; ``"9:name=systemd:/"`` gives ``"name=systemd"``. Lines it cannot parse
    are skipped.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        # maxsplit: a cgroup path may itself contain ':'
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy_id, controllers, path = parts
        if hierarchy_id == "0" and controllers == "":
            out[""] = path
            continue
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def _unescape_mount_field(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040 \011 \012 \134
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse /proc/<pid>/mountinfo; returns only cgroup and cgroup2 mounts.

    Malformed lines are skipped.
    """
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-")  # optional fields before it vary in number
        except ValueError:
            continue
        if sep < 6 or len(fields) < sep + 4:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            Mount(
                root=_unescape_mount_field(fields[3]),
                mount_point=_unescape_mount_field(fields[4]),
                fstype=fstype,
                super_options=tuple(fields[sep + 3].split(",")),
            )
        )
    return mounts


def _under_root(root: StrPath, absolute: str) -> Path:
    return Path(root) / absolute.lstrip("/")


def _cgroup_dir(root: StrPath, mount: Mount, cgroup_path: str, version: int) -> CgroupDir:
    mount_dir = _under_root(root, mount.mount_point)
    mroot = mount.root.rstrip("/")
    if cgroup_path == mount.root or cgroup_path.startswith(mroot + "/"):
        rel = cgroup_path[len(mroot) :]
    else:
        # The mount shows a part of the hierarchy the process is not in (a
        # container without a cgroup namespace, whose /proc/self/cgroup shows
        # host paths): its own cgroup is what the container mounted.
        rel = ""
    path = _under_root(mount_dir, rel) if rel.strip("/") else mount_dir
    if not path.is_dir():
        # Same story when the mount root is "/" but the host path is not in
        # the container's view: fall back to the mount point, as the JDK does.
        path = mount_dir
    return CgroupDir(version=version, path=path, mount=mount_dir)


def find_cgroups(controller: str, pid: int | str = "self", root: StrPath = "/") -> list[CgroupDir]:
    """The cgroup directories that may hold ``controller``'s files for ``pid``.

    The v2 directory comes first when a cgroup2 hierarchy is mounted, then the
    v1 directory when a v1 hierarchy carries ``controller``. Whether the files
    are really there is for the reader to find out: on a hybrid host the v2
    tree often carries no controllers at all. Returns ``[]`` when /proc cannot
    be read (not Linux, or the pid is gone).
    """
    proc = _under_root(root, f"/proc/{pid}")
    cgroup_text = read_or_none(proc / "cgroup")
    # The mount table is the reading process's, not the target's: the paths
    # we open are resolved in our own mount namespace.
    mountinfo_text = read_or_none(_under_root(root, "/proc/self/mountinfo"))
    if cgroup_text is None or mountinfo_text is None:
        return []
    return list(_resolve_cgroups(controller, cgroup_text, mountinfo_text, str(root)))


@functools.lru_cache(maxsize=64)
def _resolve_cgroups(
    controller: str, cgroup_text: str, mountinfo_text: str, root: str
) -> tuple[CgroupDir, ...]:
    # Cached on the two texts: the supervisor resolves the parent's and each worker's
    # cgroup every memory_interval_s, and parsing the mount table was most of the
    # ~0.4 ms a tick cost.  A process that moves, or a mount that changes, changes a
    # text.  A tuple of NamedTuples: nothing a caller holds can change the cache.
    paths = parse_proc_cgroup(cgroup_text)
    mounts = parse_mountinfo(mountinfo_text)
    found: list[CgroupDir] = []
    if "" in paths:
        v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
        if v2 is not None:
            found.append(_cgroup_dir(root, v2, paths[""], 2))
    if controller in paths:
        v1 = next(
            (m for m in mounts if m.fstype == "cgroup" and controller in m.super_options), None
        )
        if v1 is not None:
            found.append(_cgroup_dir(root, v1, paths[controller], 1))
    return tuple(found)


def _cpu_max_v2(text: str | None) -> float | None:
    if text is None:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cpu_quota_v1(level: Path) -> float | None:
    quota = int_or_none(read_or_none(level / "cpu.cfs_quota_us"))
    period = int_or_none(read_or_none(level / "cpu.cfs_period_us"))
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None  # -1 is v1's "no quota"
    return quota / period


def cpu_quota(pid: int | str = "self", root: StrPath = "/") -> float | None:
    """The CPU quota of ``pid``'s cgroup in CPUs (1.5 for "150000 100000"); None if unlimited.

    The smallest quota from the cgroup up to its hierarchy's mount point. None
    when no quota is set or none can be read.
    """
    quotas: list[float] = []
    for cg in find_cgroups("cpu", pid, root):
        for level in cg.levels():
            q = (
                _cpu_max_v2(read_or_none(level / "cpu.max"))
                if cg.version == 2
                else _cpu_quota_v1(level)
            )
            if q is not None:
                quotas.append(q)
    return min(quotas) if quotas else None


def _affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1  # macOS and Windows have no sched_getaffinity


def usable_cpus(root: StrPath = "/") -> int:
    """CPUs this process may use: its affinity mask, cut to ``ceil`` of its cgroup CPU quota.

    At least 1. A quota of 1.5 CPUs counts as 2: the quota is time, not cores,
    and two busy workers on 1.5 CPUs still finish sooner than one.
    """
    cpus = _affinity_cpus()
    quota = cpu_quota("self", root)
    if quota is not None:
        # round() first: 3 * 0.1 cores must not ceil to 4 via float error
        cpus = min(cpus, math.ceil(round(quota, 6)))
    return max(1, cpus)


class _Level(NamedTuple):
    """A cgroup level with a memory limit: where its usage is read, and the limit."""

    version: int
    path: Path
    limit: int


def _limited_levels(pid: int | str, root: StrPath) -> list[_Level]:
    """Every level of ``pid``'s memory cgroups that has a limit, from the cgroup up."""
    levels: list[_Level] = []
    for cg in find_cgroups("memory", pid, root):
        for i, level in enumerate(cg.levels()):
            if cg.version == 2:
                raw = read_or_none(level / "memory.max")
                limit = None if raw is None or raw.strip() == "max" else int_or_none(raw)
            else:
                limit = int_or_none(read_or_none(level / "memory.limit_in_bytes"))
                if i == 0:
                    # Covers ancestors hidden from us by a cgroup namespace.
                    stat = read_or_none(level / "memory.stat")
                    hier = stat_field(stat, "hierarchical_memory_limit")
                    if hier is not None and (limit is None or hier < limit):
                        limit = hier
                if limit is not None and limit >= V1_UNLIMITED_BYTES:
                    limit = None
            if limit is not None and limit > 0:
                levels.append(_Level(cg.version, level, limit))
    return levels


def _usage(level: _Level) -> int | None:
    """The level's memory usage net of reclaimable page cache; None if unreadable."""
    stat = read_or_none(level.path / "memory.stat")
    if level.version == 2:
        usage = int_or_none(read_or_none(level.path / "memory.current"))
        inactive = stat_field(stat, "inactive_file")
    else:
        usage = int_or_none(read_or_none(level.path / "memory.usage_in_bytes"))
        inactive = stat_field(stat, "total_inactive_file")
    if usage is not None and inactive is not None:
        # Usage counts page cache that the kernel drops before it OOM-kills anyone;
        # docker stats subtracts it the same way.
        usage = max(0, usage - inactive)
    return usage


def _headroom(levels: list[_Level]) -> int | None:
    # a level whose usage cannot be read counts as fully free (its limit)
    if not levels:
        return None
    return max(0, min(lv.limit - (_usage(lv) or 0) for lv in levels))


def memory_limit_bytes(pid: int | str = "self", root: StrPath = "/") -> int | None:
    """The memory limit of ``pid``'s cgroup in bytes; None when there is none.

    cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes`` (v1's near-2**63
    "unlimited" counts as None), the smallest from the cgroup up to the mount.
    """
    levels = _limited_levels(pid, root)
    return min(lv.limit for lv in levels) if levels else None


def cgroup_memory_headroom_bytes(pid: int | str = "self", root: StrPath = "/") -> int | None:
    """Bytes ``pid``'s cgroup can still allocate before its limit; None when unlimited.

    ``limit - usage`` at each limited level, usage net of inactive page cache,
    the smallest of them, never below 0. A level whose usage cannot be read
    counts as fully free (its limit).
    """
    return _headroom(_limited_levels(pid, root))


def meminfo_bytes(key: str, root: StrPath = "/") -> int | None:
    """Field ``key`` of /proc/meminfo (``"MemTotal"``, ``"MemAvailable"``) in bytes; None if absent.

    The same numbers as ``psutil.virtual_memory()`` (``total``, ``available``),
    which reads this file on Linux, without importing psutil: that import alone
    costs 15-30 ms here, about as much as the rest of a first ``Pool()``, which reads
    ``MemTotal`` for its default ``min_available_memory``.
    """
    text = read_or_none(Path(root) / "proc" / "meminfo")
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split()  # "MemTotal:       24555244 kB"
        if len(parts) == 3 and parts[0] == key + ":" and parts[2] == "kB":
            kib = int_or_none(parts[1])
            return kib * 1024 if kib is not None else None
    return None


def total_memory_bytes(root: StrPath = "/") -> int:
    """Memory this process could ever use: ``min(cgroup limit, physical RAM)``.

    RAM is /proc/meminfo's ``MemTotal``; psutil's figure where that file cannot
    be read (not Linux)."""
    total = meminfo_bytes("MemTotal", root)
    if total is None:
        total = int(psutil.virtual_memory().total)
    limit = memory_limit_bytes("self", root)
    return min(total, limit) if limit is not None else total


def available_memory_bytes(root: StrPath = "/") -> int:
    """Memory this process can allocate now: ``min(MemAvailable, cgroup headroom)``.

    ``MemAvailable`` from /proc/meminfo; psutil's estimate where that is missing
    (not Linux, or a kernel before 3.14)."""
    return AvailableMemory(root)()


class AvailableMemory:
    """``available_memory_bytes`` for a caller that asks every tick (the supervisor's
    memory pressure check, every ``memory_interval_s``): which cgroup levels have a limit
    is found again every ``RESOLVE_S``, their usage and MemAvailable at every call.

    Finding the levels reads the mount table, our cgroup, and a limit file per level:
    ~0.25 ms a tick on a loaded 2-vCPU VM (measured) on a machine with no limit at all.  A
    limit set or changed while the pool runs is seen within ``RESOLVE_S``.  Not
    thread-safe: one supervisor thread calls it."""

    RESOLVE_S = 1.0

    def __init__(self, root: StrPath = "/") -> None:
        self.root = root
        self._levels: list[_Level] = []
        self._resolved_at: float | None = None

    def __call__(self) -> int:
        available = meminfo_bytes("MemAvailable", self.root)
        if available is None:
            available = int(psutil.virtual_memory().available)
        now = time.monotonic()
        if self._resolved_at is None or now - self._resolved_at >= self.RESOLVE_S:
            self._levels, self._resolved_at = _limited_levels("self", self.root), now
        headroom = _headroom(self._levels)
        return min(available, headroom) if headroom is not None else available


# Decimal for the SI spellings (kB, MB, GB, TB); binary for the IEC ones (KiB..)
# and for bare letters (K, M, G, T), which is what ulimit, docker --memory and
# most people mean by "512M". Case-insensitive.
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# compiled at first use (re caches it), not by every import: ~0.2 ms
_MEMORY_PATTERN = r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$"
_MEMORY_ADVICE = (
    'give an int number of bytes, a string such as "2GB", "512MiB", "1.5G" or "100k" '
    "(kB/MB/GB are powers of 1000; K/M/G and KiB/MiB/GiB powers of 1024), or a float "
    "in (0, 1] for that fraction of this process's memory"
)


def parse_memory(value: int | float | str, *, root: StrPath = "/") -> int:
    """A memory amount in bytes, from bytes, a size string, or a fraction of our memory.

    - ``int``: bytes, at least 1.
    - ``str``: a number and a unit, case-insensitive, space allowed: ``"2GB"``
      is 2*10**9 (kB, MB, GB, TB are decimal SI), ``"512MiB"`` and ``"1.5 G"``
      are binary (KiB..TiB and bare K, M, G, T are powers of 1024), ``"100"`` or
      ``"100B"`` bytes. Fractions of a byte are dropped.
    - ``float`` in (0, 1]: that fraction of ``total_memory_bytes()``, the
      smaller of the cgroup limit and physical RAM. ``1.0`` is all of it while
      ``1`` is one byte; other floats are refused rather than guessed at.

    Raises ``ValueError`` (saying what is accepted) for anything under one byte,
    an unknown unit, or a float outside (0, 1]; ``TypeError`` for other types,
    ``bool`` included.
    """
    return memory_bytes(check_memory(value), root=root)


def check_memory(value: int | float | str) -> int | float:
    """``parse_memory`` without reading this process's memory: bytes (int) for an int or a
    size string, the fraction itself (float) for a float, for ``memory_bytes`` to resolve
    later.  Lets a Pool refuse a bad amount at once and read /proc and the cgroup files
    off its first result's path.  Raises as ``parse_memory`` does."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(
            f"memory amount must be int, float or str, not {type(value).__name__}: {_MEMORY_ADVICE}"
        )
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"memory amount {value!r} is under one byte; {_MEMORY_ADVICE}")
        return value
    if isinstance(value, float):
        if not (0.0 < value <= 1.0):
            raise ValueError(
                f"memory amount {value!r}: a float is a fraction of this process's memory and must "
                f"be in (0, 1]; for bytes pass int({value!r}) or a string; {_MEMORY_ADVICE}"
            )
        return value
    match = re.match(_MEMORY_PATTERN, value)
    if match is None:
        raise ValueError(f"cannot read memory amount {value!r}; {_MEMORY_ADVICE}")
    number, unit = match.groups()
    multiplier = _UNITS.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"unknown unit {unit!r} in memory amount {value!r}; {_MEMORY_ADVICE}")
    # Decimal, not float: float("2.3") * 10**6 is 2299999.9999999995.
    from decimal import Decimal  # only Pool(memory_limit=...) and friends need it

    nbytes = int(Decimal(number) * multiplier)
    if nbytes < 1:
        raise ValueError(f"memory amount {value!r} is under one byte; {_MEMORY_ADVICE}")
    return nbytes


def memory_bytes(amount: int | float, *, root: StrPath = "/") -> int:
    """What ``check_memory`` returned, in bytes: a fraction becomes that share of
    ``total_memory_bytes()`` (at least 1), which reads /proc and the cgroup files."""
    if isinstance(amount, float):
        return max(1, int(total_memory_bytes(root) * amount))
    return amount


def default_workers(
    memory_per_worker_bytes: int | str | float | None = None, *, root: StrPath = "/"
) -> int:
    """The default worker count: ``usable_cpus()``, cut to fit a per-worker memory budget.

    With a budget (anything ``parse_memory`` takes), at most
    ``total_memory_bytes() // budget`` workers, and never fewer than 1: a pool
    that cannot afford one worker still gets one, and its memory limit, not its
    size, then says no. Raises as ``parse_memory`` does for a bad budget.
    """
    workers = usable_cpus(root)
    if memory_per_worker_bytes is not None:
        budget = parse_memory(memory_per_worker_bytes, root=root)
        workers = min(workers, total_memory_bytes(root) // budget)
    return max(1, workers)


def threads_per_worker(workers: int, root: StrPath = "/") -> int:
    """``max(1, usable_cpus() // workers)``: the BLAS threads each of ``workers`` gets.
    The cgroup files are read only when the affinity mask leaves room for two threads
    per worker, since a quota can only lower the count; a pool with a worker per CPU
    (the default) gets 1 without them."""
    if _affinity_cpus() < 2 * workers:
        return 1
    return max(1, usable_cpus(root) // workers)


def blas_thread_env(
    workers: int, *, environ: Mapping[str, str] | None = None, root: StrPath = "/"
) -> dict[str, str]:
    """Thread-count variables for a worker's environment, so BLAS pools do not oversubscribe.

    Each of ``BLAS_THREAD_VARS`` gets ``max(1, usable_cpus() // workers)``, except
    a variable already set in ``environ`` (default ``os.environ``): the user
    chose it, and it is left out of the result so the worker inherits it
    unchanged. Returns only the variables to set. Raises ``ValueError`` for
    ``workers < 1``.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers!r}")
    env = os.environ if environ is None else environ
    threads = str(threads_per_worker(workers, root))
    return {name: threads for name in BLAS_THREAD_VARS if name not in env}
