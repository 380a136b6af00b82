"""``python -m fastpool doctor [--json] [--smoke]``: what limits a pool on this machine.

One screen to paste into a bug report: versions and the compiled core; usable CPUs
(affinity and cgroup quota) and the default worker count; BLAS libraries, their
threads, and workers x threads against the CPUs; memory (system, cgroup limit, whether
the OOM-kill counter is readable); how the worker template will start (fork or spawn,
and why) and whether this process already runs threads; the kernel features fastpool
uses (memfd, pidfd, futex); RLIMIT_NOFILE and RLIMIT_NPROC; optional extras.

``--smoke`` starts a pool, runs one task, and times the first pool and the round trip.
Exit 0 when nothing blocks fastpool (warnings allowed), 1 when something does: each
finding says what to do.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from typing import Any

SMOKE_CALLS = 200
FDS_PER_WORKER = 4  # parent: pidfd and its share of the board; template: the worker's pipe ends
FDS_BASE = 32  # board and arena memfds, template socket, wake-up pipe, and headroom
# syscall numbers of futex(2), by machine (asm-generic ones share 98)
SYS_FUTEX = {
    "x86_64": 202,
    "aarch64": 98,
    "riscv64": 98,
    "ppc64le": 221,
    "ppc64": 221,
    "s390x": 238,
    "armv7l": 240,
    "i686": 240,
}
EXTRAS = {  # module -> (distribution, what it is for)
    "tqdm": ("tqdm", "progress bars: pip install 'fastpool[progress]'"),
    "rich": ("rich", "rich progress bars (opt-in)"),
    "matplotlib": ("matplotlib", "bench --plot: pip install 'fastpool[plot]'"),
    "distributed": ("distributed", "Dask integration"),
    "loky": ("loky", "bench peer: pip install 'fastpool[bench]'"),
    "joblib": ("joblib", "bench peer: pip install 'fastpool[bench]'"),
    "pytest_benchmark": ("pytest-benchmark", "the developer benchmarks in benchmarks/"),
    "threadpoolctl": ("threadpoolctl", "BLAS thread limits in workers (required)"),
    "cloudpickle": ("cloudpickle", "functions from __main__ and notebooks (required)"),
    "psutil": ("psutil", "worker memory sampling (required)"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the screen"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="also start a pool, run one task, and time the first pool and the round trip",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="judge this worker count instead of the default (and use it for --smoke)",
    )


class Findings:
    """Problems found, each with what to do: errors block fastpool, warnings slow it down."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def error(self, what: str, fix: str) -> None:
        self.items.append({"level": "error", "what": what, "fix": fix})

    def warning(self, what: str, fix: str) -> None:
        self.items.append({"level": "warning", "what": what, "fix": fix})

    @property
    def blocked(self) -> bool:
        return any(i["level"] == "error" for i in self.items)


# ---- facts --------------------------------------------------------------------------


def _threads_now() -> int:
    from fastpool._runtime import _forksafe

    return _forksafe.os_threads()


def kernel_features() -> dict[str, str]:
    """ "ok", or what failed, for each kernel feature fastpool needs."""
    out: dict[str, str] = {}
    try:
        fd = os.memfd_create("fastpool-doctor", os.MFD_CLOEXEC)
        os.close(fd)
        out["memfd"] = "ok"
    except (AttributeError, OSError) as exc:
        out["memfd"] = f"unavailable ({exc})"
    try:
        fd = os.pidfd_open(os.getpid())
        os.close(fd)
        out["pidfd"] = "ok"
    except (AttributeError, OSError) as exc:
        out["pidfd"] = f"unavailable ({exc})"
    nr = SYS_FUTEX.get(platform.machine())
    if nr is None:
        out["futex"] = f"not checked (no syscall number known for {platform.machine()})"
    else:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            word = ctypes.c_uint32(0)
            # FUTEX_WAKE (1) of nobody on a word of ours: returns 0 when futex works
            rc = libc.syscall(nr, ctypes.byref(word), 1, 1, None, None, 0)
            err = ctypes.get_errno()
            out["futex"] = "ok" if rc >= 0 else f"unavailable ({errno.errorcode.get(err, err)})"
        except (OSError, AttributeError) as exc:
            out["futex"] = f"not checked ({exc})"
    return out


def template_plan() -> dict[str, Any]:
    """How the template would start if this process made its first pool now, and why."""
    from fastpool._runtime import _template

    method, why = _template.start_plan()
    return {"method": method, "why": why}


def _user_processes() -> int | None:
    try:
        import psutil

        uid = os.getuid()
        return sum(
            1
            for p in psutil.process_iter(["uids"])
            if p.info["uids"] and p.info["uids"].real == uid
        )
    except Exception:  # noqa: BLE001 - a count we cannot take is reported as unknown
        return None


def _limit(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else value


def _extras() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for module, (dist, _why) in EXTRAS.items():
        if importlib.util.find_spec(module) is None:
            found[module] = None
            continue
        try:
            found[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[module] = "installed"
    return found


def collect(workers: int | None, findings: Findings, threads_at_start: int) -> dict[str, Any]:
    """Every fact, as a JSON-able dict; problems go to ``findings``."""
    import fastpool
    from fastpool._bench import env as _env
    from fastpool._supervision import _memory, _sizing

    facts: dict[str, Any] = {
        "fastpool": fastpool.__version__,
        "location": os.path.dirname(fastpool.__file__),
        "core": fastpool.CORE_ERROR is None,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
    }
    if fastpool.CORE_ERROR is not None:
        findings.error("fastpool's compiled core does not load", fastpool.CORE_ERROR)
    if sys.platform != "linux":
        findings.error(
            f"this is {sys.platform}: fastpool runs on Linux only",
            "it needs memfd, pidfd and futex; use Linux (a VM or WSL2 will do)",
        )
    usable = _sizing.usable_cpus()
    default = _sizing.default_workers()
    n = workers or default
    facts["cpus"] = {
        "os_cpu_count": os.cpu_count(),
        "affinity": _env.affinity_cpus(),
        "cgroup_quota": _sizing.cpu_quota(),
        "usable": usable,
        "default_workers": default,
    }
    facts["threads_at_start"] = threads_at_start
    with contextlib.suppress(ImportError):
        import numpy

        facts["numpy"] = numpy.__version__
    facts.setdefault("numpy", None)
    if facts["numpy"] is None:
        findings.error("NumPy is not importable", "pip install numpy (fastpool needs numpy>=1.25)")
    facts["threads_after_numpy"] = _threads_now()
    blas = _env.blas_info()
    chosen = {v: os.environ[v] for v in _sizing.BLAS_THREAD_VARS if v in os.environ}
    per_worker = max(1, usable // n)
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if v in chosen and chosen[v].isdigit():
            per_worker = max(per_worker, int(chosen[v]))
            break
    facts["blas"] = {
        "libraries": blas,
        "env": chosen,
        "workers": n,
        "threads_per_worker": per_worker,
        "total_threads": n * per_worker,
    }
    if n * per_worker > usable:
        findings.warning(
            f"{n} workers x {per_worker} BLAS threads = {n * per_worker} threads on {usable} "
            "usable CPUs: oversubscribed (BLAS threads fight for cores)",
            f"set {', '.join(chosen) or 'OMP_NUM_THREADS'} to {max(1, usable // n)} "
            "(usable CPUs // workers) or unset it, or pass "
            f"Pool(blas_threads={max(1, usable // n)})",
        )
    cg = _memory.cgroup_of()
    oom = _memory.oom_kill_count(cg)
    facts["memory"] = {
        "total_bytes": _sizing.total_memory_bytes(),
        "available_bytes": _sizing.available_memory_bytes(),
        "cgroup_limit_bytes": _sizing.memory_limit_bytes(),
        "oom_kill_counter": oom,
        "oom_kill_counter_readable": oom is not None,
        "system_oom_kills": _memory.system_oom_kill_count(),
    }
    if oom is None:
        findings.warning(
            "the cgroup OOM-kill counter is not readable here",
            "a worker killed by the kernel's OOM killer is reported as WorkerCrashed "
            "(SIGKILL), not WorkerMemoryError; set Pool(memory_limit=...) so fastpool "
            "kills it first and says so",
        )
    facts["template"] = {
        "now": template_plan(),
        "FASTPOOL_TEMPLATE_START": os.environ.get("FASTPOOL_TEMPLATE_START"),
    }
    if (
        facts["template"]["now"]["method"] == "spawn"
        and threads_at_start == 1
        and facts["threads_after_numpy"] > 1
    ):
        facts["template"]["after_import_numpy"] = (
            f"importing NumPy started {facts['threads_after_numpy'] - 1} thread(s) that are not "
            "idle OpenBLAS workers, so a script that imports numpy before its first Pool() gets a "
            "spawned template (a new interpreter: a slower first pool). OMP_NUM_THREADS=1 in the "
            "environment keeps the process forkable, at the cost of the parent's own BLAS "
            "parallelism"
        )
    facts["parent_threads"] = {
        "python": threading.active_count(),
        "os": facts["threads_after_numpy"],
    }
    facts["kernel"] = kernel_features()
    for feature, state in facts["kernel"].items():
        if state != "ok" and not state.startswith("not checked"):
            findings.error(
                f"kernel feature {feature}: {state}",
                "fastpool needs Linux 5.3 or later (memfd_create, pidfd_open, futex); "
                "a seccomp profile (Docker, gVisor) may also block them: allow those syscalls",
            )
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    need_fds = FDS_BASE + FDS_PER_WORKER * n
    running = _user_processes()
    facts["limits"] = {
        "RLIMIT_NOFILE": [_limit(nofile[0]), _limit(nofile[1])],
        "RLIMIT_NPROC": [_limit(nproc[0]), _limit(nproc[1])],
        "fds_needed": need_fds,
        "user_processes": running,
    }
    if _limit(nofile[0]) is not None and nofile[0] < need_fds:
        findings.error(
            f"RLIMIT_NOFILE is {nofile[0]}; {n} workers need about {need_fds} descriptors",
            f"raise it: `ulimit -n {max(need_fds, 4096)}` before starting Python",
        )
    if _limit(nproc[0]) is not None and running is not None and nproc[0] < running + n + 2:
        findings.error(
            f"RLIMIT_NPROC is {nproc[0]} and this user runs {running} processes: no room for "
            f"{n} workers and the template",
            f"raise it: `ulimit -u {running + 4 * n + 16}`",
        )
    facts["extras"] = _extras()
    return facts


def smoke(workers: int, findings: Findings) -> dict[str, Any]:
    """Start a pool, run one task, time the first result and SMOKE_CALLS no-op round trips."""
    import fastpool
    from fastpool._bench import tasks

    out: dict[str, Any] = {"workers": workers}
    try:
        t0 = time.perf_counter()
        pool = fastpool.Pool(workers)
        try:
            assert pool.submit(tasks.square, 7).result(timeout=60) == 49
            out["first_result_s"] = time.perf_counter() - t0
            lat = []
            for _ in range(SMOKE_CALLS):
                t1 = time.perf_counter()
                pool.submit(tasks.noop).result(timeout=60)
                lat.append(time.perf_counter() - t1)
            lat.sort()
            out["round_trip_median_s"] = statistics.median(lat)
            out["round_trip_p99_s"] = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            pids = pool.pids()
        finally:
            t2 = time.perf_counter()
            pool.shutdown(wait=True)
            out["shutdown_s"] = time.perf_counter() - t2
        from fastpool._runtime import _template

        out["template_pid"] = _template.template().pid
        left = [p for p in pids if _alive(p)]
        out["workers_left"] = left
        if left:
            findings.error(
                f"workers {left} outlived pool.shutdown()", "report this as a fastpool bug"
            )
    except Exception as exc:  # noqa: BLE001 - the smoke test reports whatever went wrong
        out["error"] = f"{type(exc).__name__}: {exc}"
        findings.error(
            f"the smoke test failed: {out['error']}",
            "run again with `python -X dev -m fastpool doctor --smoke` and include the output "
            "in a bug report",
        )
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---- output ---------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def render(facts: dict[str, Any], findings: Findings) -> str:
    from fastpool._bench.env import blas_summary
    from fastpool._bench.report import fmt_time

    c, b, m, t, k, lim = (
        facts[x] for x in ("cpus", "blas", "memory", "template", "kernel", "limits")
    )
    quota = f"{c['cgroup_quota']:g}" if c["cgroup_quota"] else "none"
    env_text = (
        ", ".join(f"{name}={v}" for name, v in b["env"].items())
        or "no BLAS variable set: fastpool sets 1, then raises it to usable // workers"
    )
    oom_text = (
        f"readable ({m['oom_kill_counter']} so far)"
        if m["oom_kill_counter_readable"]
        else "NOT readable"
    )
    lines = [
        f"fastpool {facts['fastpool']} at {facts['location']}",
        f"  compiled core   {'present' if facts['core'] else 'MISSING (see below)'}",
        f"  Python          {facts['python']} ({facts['executable']})",
        f"  NumPy           {facts['numpy']}",
        f"  platform        {facts['platform']}",
        "CPUs",
        f"  os.cpu_count {c['os_cpu_count']}, affinity {c['affinity']}, cgroup quota {quota} "
        f"-> usable {c['usable']}; default workers {c['default_workers']}",
        "BLAS",
        f"  in this process {blas_summary(b['libraries'])}",
        f"  in each worker  {b['threads_per_worker']} thread(s) ({env_text})",
        f"  {b['workers']} workers x {b['threads_per_worker']} = {b['total_threads']} threads on "
        f"{c['usable']} usable CPUs: "
        f"{'oversubscribed' if b['total_threads'] > c['usable'] else 'ok'}",
        "Memory",
        f"  system {_mib(m['total_bytes'])} usable, {_mib(m['available_bytes'])} available; "
        f"cgroup limit {_mib(m['cgroup_limit_bytes'])}",
        f"  OOM-kill counter {oom_text}; "
        "system-wide OOM kills "
        f"{m['system_oom_kills'] if m['system_oom_kills'] is not None else 'unknown'}",
        "Template (the process workers are forked from)",
        f"  a first pool made now would {t['now']['method']} it: {t['now']['why']}",
        f"  this process runs {facts['parent_threads']['python']} Python and "
        f"{facts['parent_threads']['os']} OS "
        f"thread(s); {facts['threads_at_start']} before NumPy was imported",
    ]
    if "after_import_numpy" in t:
        lines.append(f"  note: {t['after_import_numpy']}")
    lines += [
        "Kernel",
        "  " + ", ".join(f"{name} {state}" for name, state in k.items()),
        "Limits",
        f"  RLIMIT_NOFILE {lim['RLIMIT_NOFILE'][0] or 'unlimited'} "
        f"(hard {lim['RLIMIT_NOFILE'][1] or 'unlimited'}; "
        f"about {lim['fds_needed']} needed), RLIMIT_NPROC {lim['RLIMIT_NPROC'][0] or 'unlimited'} "
        f"({lim['user_processes']} processes of this user now)",
        "Optional extras",
        "  " + ", ".join(f"{name} {ver or 'no'}" for name, ver in facts["extras"].items()),
    ]
    if "smoke" in facts:
        s = facts["smoke"]
        lines.append("Smoke test")
        if "error" in s:
            lines.append(f"  FAILED: {s['error']}")
        else:
            lines.append(
                f"  Pool({s['workers']}) constructor to first result "
                f"{fmt_time(s['first_result_s'])}; "
                f"no-op round trip median {fmt_time(s['round_trip_median_s'])}, p99 "
                f"{fmt_time(s['round_trip_p99_s'])} ({SMOKE_CALLS} calls); shutdown "
                f"{fmt_time(s['shutdown_s'])}, {len(s['workers_left'])} worker(s) left"
            )
    lines.append("")
    for item in findings.items:
        lines.append(f"{item['level'].upper()}: {item['what']}.\n  What to do: {item['fix']}.")
    lines.append(
        "BLOCKED: fastpool cannot run here until the errors above are fixed."
        if findings.blocked
        else "OK: nothing blocks fastpool here"
        + (" (see the warnings above)." if findings.items else ".")
    )
    return "\n".join(lines)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    threads_at_start = _threads_now()  # before anything here imports NumPy
    findings = Findings()
    facts = collect(args.workers, findings, threads_at_start)
    if args.smoke:
        if facts["core"] and not findings.blocked:
            facts["smoke"] = smoke(args.workers or facts["cpus"]["default_workers"], findings)
        else:
            facts["smoke"] = {"error": "not run: fastpool is blocked here (see the errors)"}
    facts["findings"] = findings.items
    facts["ok"] = not findings.blocked
    if args.json:
        print(json.dumps(facts, indent=1, default=str))
    else:
        print(render(facts, findings))
    return 1 if findings.blocked else 0
