"""``python -m fastpool bench``: fastpool against the installed peers, or your own function.

    python -m fastpool bench [--quick] [--section all|quiet|contention|workloads] [--batch-mib MIB]
                             [--peers mp,ppe,loky,joblib] [--json out.json]
                             [--plot [out.png]] [--compare old.json] [--processes N]
    python -m fastpool bench --compare old.json new.json      (no run: two files)
    python -m fastpool bench --user my_module:my_func --args 'range(10_000)'

The scenarios and the peer adapters are the package's (fastpool/_bench/), the same
ones the developer's pytest-benchmark suite in benchmarks/ times. Progress goes to
stderr, the report to stdout. Exit 0 when every row ran, 1 when one failed, 2 for
bad usage (an unknown peer, --plot without matplotlib, an unreadable --compare file).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any, TextIO

DEFAULT_PEERS = "mp,ppe,loky,joblib"
PROCESSES = 10  # fresh processes per peer, interleaved (--processes)
QUICK_PROCESSES = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quick",
        action="store_true",
        help="a quick look: the quiet section only (unless --section names another), in 2 "
        "processes per peer, fewer rounds, the round trip with the run's workers only, arrays "
        "of 16 MiB only, no cold-pool bursts: about 30 s on two cores, quiet; --section "
        "contention --quick about 100 s, --section workloads --quick several minutes",
    )
    p.add_argument(
        "--peers",
        default=DEFAULT_PEERS,
        metavar="LIST",
        help=f"comma-separated peers beside fastpool: mp (multiprocessing.Pool), ppe "
        f"(ProcessPoolExecutor), loky, joblib; those not installed are skipped "
        f"(default: {DEFAULT_PEERS})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="workers per pool (default: 2 for the standard scenarios, the round trip "
        "also with 1; with --user, tries 1 up to the usable CPUs)",
    )
    p.add_argument(
        "--section",
        choices=("all", "quiet", "contention", "workloads"),
        default=None,
        help="quiet: the standard scenarios, on the machine as it is; contention: the load the "
        "bench makes itself (CPU hogs, three programs at once, an oversubscribed pool), the "
        "idle cost of pools of 2, 8 and 16, and the memory a batch of slices leaves held; "
        "workloads: batch jobs (long tasks, a heavy tail, a 50 MB image bound or passed, "
        "per-worker state, a model loaded per worker, arrays returned, a GridSearchCV) as "
        "each library's users write them, fastpool, fastpool.mp, the joblib backend, MPIRE, "
        "joblib/loky, Ray, Dask, multiprocessing.Pool and ProcessPoolExecutor, with serial "
        "and ideal rows; all: the three, in that order (default; with --quick: quiet)",
    )
    p.add_argument(
        "--batch-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="the contention section's batch: a float32 array of MIB (default 2048, 256 with "
        "--quick, less where a sixth of the available memory is less)",
    )
    p.add_argument(
        "--only",
        metavar="IDS",
        help="run only the scenarios whose id contains one of these comma-separated "
        "words: hop, submits, map, arrays, one-way, round-trip, start, or a size "
        "such as 16",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        metavar="N",
        help=f"run each peer's rounds in N fresh processes, the peers interleaved, and show "
        f"the spread of the per-process medians (default: {PROCESSES}, {QUICK_PROCESSES} with "
        f"--quick; 1: every round in this process)",
    )
    p.add_argument("--json", metavar="PATH", help="write raw samples and metadata to PATH")
    p.add_argument(
        "--plot",
        nargs="?",
        const="",
        metavar="PATH",
        help="write a PNG of the ratios to multiprocessing.Pool to PATH (needs fastpool[plot]); "
        "without PATH, to a new file in the temporary directory, never into the current "
        "directory (a checkout, say): the path is printed",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="JSON",
        help="OLD: run, then print Before/After/Ratio against OLD; OLD NEW: compare "
        "two --json files without running",
    )
    p.add_argument(
        "--user",
        metavar="MODULE:FUNC",
        help="time your own function on fastpool, multiprocessing.Pool and serially, "
        "and suggest a worker count and chunk size",
    )
    p.add_argument(
        "--args",
        dest="user_args",
        metavar="EXPR",
        help="with --user: the inputs, one call each: a Python expression "
        "(numpy as np) such as 'range(1000)', or MODULE:NAME of a list or of a "
        "function returning one",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")


class Progress:
    """What is running, on stderr: a redrawn bar on a terminal, a line per step elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr, enabled: bool = True) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = enabled and stream.isatty()
        self.t0 = time.perf_counter()
        self._last = ""

    def __call__(self, i: int, n: int, case: Any) -> None:
        if not self.enabled:
            return
        what = f"{case.group} · {case.label}" + (
            f" {case.variant}" if case.variant and not case.idiom else ""
        )
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            width = 24
            filled = int(width * i / max(1, n))
            line = f"\r[{'#' * filled}{'.' * (width - filled)}] {i + 1}/{n} {elapsed:5.1f}s  {what}"
            self.stream.write(line[:160].ljust(len(self._last)))
            self._last = line[:160]
        else:
            self.stream.write(f"[{i + 1}/{n} {elapsed:5.1f}s] {what}\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self._last:
            self.stream.write("\r" + " " * len(self._last) + "\r")
            self.stream.flush()


def _peer_list(text: str) -> tuple[list[str], list[str]]:
    """(peer names to run, fastpool first; unknown keys)."""
    from fastpool._bench.peers import KEYS

    keys = [k.strip().lower() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in KEYS]
    names = ["fastpool"] + [KEYS[k] for k in keys if k in KEYS and KEYS[k] != "fastpool"]
    return list(dict.fromkeys(names)), unknown


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from fastpool._bench import report

    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.processes is not None and args.processes < 1:
        parser.error("--processes must be at least 1")
    if args.batch_mib is not None and args.batch_mib < 1:
        parser.error("--batch-mib must be at least 1")
    if args.plot is not None:
        try:
            report.require_matplotlib()
        except ImportError as exc:
            print(f"python -m fastpool bench: {exc}", file=sys.stderr)
            return 2
        args.plot = args.plot or report.default_plot_path()
    if args.compare and len(args.compare) > 2:
        parser.error("--compare takes OLD.json, or OLD.json NEW.json")
    old = None
    if args.compare:
        try:
            old = [report.load(path)[0] for path in args.compare]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"python -m fastpool bench --compare: cannot read {exc}", file=sys.stderr)
            return 2
        if len(old) == 2:  # two files: compare them, run nothing
            print(report.compare(old[0], old[1], args.compare[0], args.compare[1]))
            if args.plot:
                report.plot(old[1], args.plot, f"python -m fastpool bench: {args.compare[1]}")
                print(f"\nplot written to {args.plot}")
            return 0
    if args.user:
        if not args.user_args:
            parser.error("--user needs --args: the inputs, e.g. --args 'range(1000)'")
        from fastpool._bench import user

        return user.run(
            args.user,
            args.user_args,
            workers=args.workers,
            json_path=args.json,
            progress=not args.no_progress,
        )
    return _standard(args, parser, report, old[0] if old else None)


def _standard(
    args: argparse.Namespace, parser: argparse.ArgumentParser, report: Any, old: list | None
) -> int:
    from fastpool._bench import env as _env
    from fastpool._bench import peers as _peers
    from fastpool._bench import runner, scenarios

    names, unknown = _peer_list(args.peers)
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}: choose from mp, ppe, loky, joblib")
    skipped = {n: why for n in names if (why := _peers.available(n))}
    if "fastpool" in skipped:
        print(f"python -m fastpool bench: {skipped['fastpool']}", file=sys.stderr)
        return 1
    names = [n for n in names if n not in skipped]
    workers = args.workers or scenarios.START_WORKERS
    if args.section is None:  # --quick is a quick look: the quiet section alone
        args.section = "quiet" if args.quick else "all"
    spec: dict[str, Any] = {
        "peers": names,
        "quick": args.quick,
        "only": args.only,
        "workers": workers,
        "section": args.section,
        "batch_mib": None,
    }
    if args.section in ("all", "contention"):
        from fastpool._bench import contention

        # one size for every process of the run, decided here (available memory moves)
        spec["batch_mib"] = args.batch_mib or contention.batch_mib(args.quick)
    cases = scenarios.catalog(**spec)
    processes = args.processes or (QUICK_PROCESSES if args.quick else PROCESSES)
    if not cases:
        parser.error(f"--only {args.only!r} selects no scenario")
    load_start = _env.machine_load()
    busy = _env.busy_warning()
    if busy:
        print(busy, file=sys.stderr)
    uncompiled = _env.bytecode_warning()
    if uncompiled:
        print(uncompiled, file=sys.stderr)
    t0 = time.perf_counter()
    progress = Progress(enabled=not args.no_progress)
    try:
        results = runner.run(cases, progress, processes=processes, spec=spec)
    finally:
        progress.done()
    took = time.perf_counter() - t0
    load_end = _env.machine_load()
    regime = "busy" if "busy" in (load_start["regime"], load_end["regime"]) else "quiet"
    env = _env.environment()
    mode = "--quick" if args.quick else "full"
    print(
        f"## python -m fastpool bench ({mode}, section {args.section}, {workers} workers, "
        f"up to {processes} fresh process{'es' if processes > 1 else ''} per peer: each row's "
        f"(n) says how many, {took:.0f} s)\n"
    )
    from fastpool._bench import workloads

    mine = [r for r in results if not workloads.is_workload(r.scenario)]
    jobs = [r for r in results if workloads.is_workload(r.scenario)]
    if mine:
        print(report.table(mine))
        print()
        print(report.LEGEND)
    if any(report.is_contention(r.scenario) for r in mine):
        print()
        print(report.CONTENTION_LEGEND)
    if jobs:
        print(("\n" if mine else "") + workloads.table(jobs))
        print()
        print(workloads.LEGEND)
    for name, why in skipped.items():
        print(f"\nnot run: {name}: {why}")
    if args.quick:
        print(
            "\n--quick: fewer rounds, arrays of 16 MiB only, the quiet section unless --section "
            "names another; run without it for the full set."
        )
    for line in report.unstable(mine) + [w for w in (busy, uncompiled) if w]:
        print("\n" + line)
    failed = report.failures(mine + workloads.failures(jobs))
    for line in failed:
        print(f"\nFAILED: {line}")
    print(
        f"\nregime: {regime} (at the start: {_env.describe_load(load_start)}; at the end: "
        f"{_env.describe_load(load_end)})"
    )
    print("\n" + _env.footer(env))
    meta = {
        "argv": shlex.join(sys.argv),
        "quick": args.quick,
        "section": args.section,
        "batch_mib": spec["batch_mib"],
        "workers": workers,
        "processes": processes,
        "peers": names,
        "skipped": skipped,
        "seconds": round(took, 1),
        "regime": regime,
        "load": {"start": load_start, "end": load_end},
    }
    if args.json:
        report.dump(results, env, meta, args.json)
        print(f"\nraw samples written to {args.json}")
    if args.plot:
        report.plot(
            mine, args.plot, f"python -m fastpool bench ({mode}), fastpool {env['fastpool']}"
        )
        print(f"plot written to {args.plot}")
    if old is not None:
        print()
        print(report.compare(old, results, args.compare[0], "this run"))
    return 1 if failed else 0
