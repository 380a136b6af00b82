"""Facts about this machine and interpreter, for the bench footer and for doctor.

Every reader degrades to None (or an empty list) rather than raising: a fact that
cannot be read is reported as unknown, never as a crash of the report.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from fastpool._supervision import _sizing


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def affinity_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def blas_info() -> list[dict[str, Any]]:
    """The BLAS/OpenMP libraries loaded in this process, with their thread counts.

    Imports numpy (which loads its BLAS) and asks threadpoolctl; [] without either."""
    try:
        import numpy  # noqa: F401  (loads the BLAS threadpoolctl then finds)
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = (
        "user_api",
        "internal_api",
        "prefix",
        "version",
        "num_threads",
        "threading_layer",
        "filepath",
    )
    return [{k: lib.get(k) for k in keep} for lib in threadpool_info()]


def blas_summary(libs: list[dict[str, Any]]) -> str:
    if not libs:
        return "none found (threadpoolctl sees no BLAS or OpenMP library)"
    return ", ".join(
        f"{lib.get('internal_api') or lib.get('prefix')} {lib.get('version') or ''}".strip()
        + f" ({lib.get('num_threads')} threads)"
        for lib in libs
    )


def git_commit(pkg_dir: Path | None = None) -> str | None:
    """The commit of the source checkout fastpool runs from, if it runs from one."""
    import fastpool

    root = (pkg_dir or Path(fastpool.__file__).resolve().parent).parent
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=10", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() + (" (dirty)" if dirty.stdout.strip() else "")


BUSY_LOAD_PER_CPU = 0.5
RUNNABLE_SAMPLES = 5  # procs_running is a snapshot: the median of a few, 10 ms apart


def procs_running() -> int | None:
    """Processes runnable right now, machine-wide (``procs_running`` of /proc/stat; the
    reader itself is one of them); None where there is no /proc/stat."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    return None


def machine_load(usable: int | None = None) -> dict[str, Any]:
    """What else runs on the CPUs: the load averages (1, 5, 15 min), the median of a few
    ``procs_running`` samples less this reader, and the regime they make, "busy" when the
    1-minute load or the other runnable processes exceed BUSY_LOAD_PER_CPU of the usable
    CPUs, else "quiet". A fact that cannot be read is None and does not count."""
    import statistics
    import time

    try:
        loadavg: tuple[float, ...] | None = tuple(os.getloadavg())
    except (AttributeError, OSError):
        loadavg = None
    samples = []
    for i in range(RUNNABLE_SAMPLES):
        if i:
            time.sleep(0.01)
        n = procs_running()
        if n is not None:
            samples.append(n)
    others = max(0, round(statistics.median(samples)) - 1) if samples else None
    cpus = usable or _sizing.usable_cpus()
    limit = BUSY_LOAD_PER_CPU * cpus
    busy = (loadavg is not None and loadavg[0] > limit) or (others is not None and others > limit)
    return {
        "loadavg": loadavg,
        "runnable_others": others,
        "usable_cpus": cpus,
        "regime": "busy" if busy else "quiet",
    }


def describe_load(load: dict[str, Any]) -> str:
    """``load average 1.10 / 0.80 / 0.52, 2 other runnable processes, on 2 usable CPUs:
    busy`` (one line for a report)."""
    avg = load.get("loadavg")
    others = load.get("runnable_others")
    parts = [
        "load average " + (" / ".join(f"{x:.2f}" for x in avg) if avg else "unknown"),
        "runnable processes unknown"
        if others is None
        else f"{others} other runnable process{'es' if others != 1 else ''}",
    ]
    return f"{', '.join(parts)}, on {load.get('usable_cpus')} usable CPUs: {load['regime']}"


def busy_warning(usable: int | None = None) -> str | None:
    """A sentence when other programs already load the CPUs (1-minute load average over
    half the usable CPUs), since every timing then measures them too; None otherwise."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cpus = usable or _sizing.usable_cpus()
    if load <= BUSY_LOAD_PER_CPU * cpus:
        return None
    return (
        f"WARNING: the machine is busy before this run started (load average {load:.1f} on "
        f"{cpus} usable CPUs): other programs compete for the cores, so the timings are noisy "
        "and the ratios may not hold. Run again when it is quiet."
    )


def bytecode_warning() -> str | None:
    """A sentence when a fresh interpreter would compile fastpool's modules from source
    (no up-to-date .pyc, and PYTHONDONTWRITEBYTECODE keeps it from writing one): the
    start and import rows then time the compiler, ~50 ms measured here."""
    import importlib.util

    import fastpool

    if not sys.dont_write_bytecode:
        return None
    stale = []
    for name in ("__init__.py", "pool.py", "errors.py"):
        src = os.path.join(os.path.dirname(fastpool.__file__), name)
        pyc = importlib.util.cache_from_source(src)
        try:
            if os.path.getmtime(pyc) < os.path.getmtime(src):
                stale.append(name)
        except OSError:
            stale.append(name)
    if not stale:
        return None
    return (
        "WARNING: PYTHONDONTWRITEBYTECODE is set and fastpool has no up-to-date bytecode "
        f"({', '.join(stale)}): every fresh process compiles it, and the start and import "
        "rows include that. Run `python -m compileall fastpool` in its folder first."
    )


def environment() -> dict[str, Any]:
    """The bench footer's facts: CPUs and quota, kernel, Python, NumPy, BLAS, fastpool."""
    import fastpool

    numpy_version = None
    with contextlib.suppress(ImportError):
        import numpy

        numpy_version = numpy.__version__
    return {
        "fastpool": fastpool.__version__,
        "core": fastpool.CORE_ERROR is None,
        "commit": git_commit(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "numpy": numpy_version,
        "blas": blas_info(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": affinity_cpus(),
        "cpu_quota": _sizing.cpu_quota(),
        "usable_cpus": _sizing.usable_cpus(),
        "memory_bytes": _sizing.total_memory_bytes(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "kernel": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
    }


def footer(env: dict[str, Any]) -> str:
    """One paragraph for under the table."""
    quota = env.get("cpu_quota")
    quota_text = f"cgroup quota {quota:g} CPUs" if quota else "no cgroup CPU quota"
    commit = f", commit {env['commit']}" if env.get("commit") else ""
    return (
        f"_{env.get('cpu_model') or 'unknown CPU'}: {env.get('cpu_count')} CPUs, "
        f"{env.get('affinity_cpus')} in this process's affinity, {quota_text}, "
        f"{env.get('usable_cpus')} usable; {env.get('kernel')} {env.get('machine')}; "
        f"{env.get('python')}; NumPy {env.get('numpy')}; "
        f"BLAS {blas_summary(env.get('blas') or [])}; "
        f"fastpool {env.get('fastpool')}{commit}._"
    )
