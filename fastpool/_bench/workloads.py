"""The workloads section of ``python -m fastpool bench`` (``--section workloads``): the batch
jobs users bring, each written as that library's users write it, timed from the pool's
construction to the end of its exit, one fresh process per trial, every library in the
same run, the trials interleaved (runner.run).

    long          20 tasks of 0.2 s CPU, a list
    long-gen      the same from a generator (no length)
    tail          60 tasks of seeded Pareto(1.5) lengths (most short, a few 10x the median)
    partial       filters over a 50 MB image bound into the function (functools.partial)
    closure       the same image in a closure (a function defined where the image is)
    argument      the same image as an argument: the library's idiom for a large one
                  (pool.share, shared_objects, ray.put, client.scatter; by value elsewhere)
    state         200 documents counted into per-worker state, gathered at the end
    init          a 0.5 s model load per worker, then 40 evaluations of 0.05 s
    returns       40 tasks that each return a new 8 MB array
    gridsearch    scikit-learn's GridSearchCV (SVC, 3 folds) through joblib's backends

The code of each library is workload_libs.py's. Beside the libraries, two rows: "serial"
(a loop in one process, each task timed) and "ideal", made from that serial run's task
times in the same trial: max(the tasks' total over the workers, the longest task), plus
what every worker pays once (the model load, the search's refit), plus one copy of a
large input into memory the workers can see. Ratios are to the best library's median
and to the ideal's. A library that raised shows "fails: <exception>", one not installed
"not installed": both are rows, never a stop.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections import OrderedDict
from typing import Any

from fastpool._bench import workload_libs as _libs
from fastpool._bench.peers import PeerUnavailable
from fastpool._bench.runner import Result
from fastpool._bench.scenarios import Case

PREFIX = "workload-"
IDEAL = "ideal"
TRIALS = {"full": 3, "quick": 2, "tiny": 1}
TRIAL_TIMEOUT_S = 300
TITLES = {
    "long": "{long_n} tasks of {long_s:g} s CPU, a list",
    "long-gen": "{long_n} tasks of {long_s:g} s CPU, from a generator",
    "tail": "{tail_n} tasks of heavy-tailed length (seeded Pareto 1.5)",
    "partial": "{image_tasks} filters over a {image_mb:g} MB image bound in partial()",
    "closure": "{image_tasks} filters over a {image_mb:g} MB image in a closure",
    "argument": "{image_tasks} filters over a {image_mb:g} MB image as an argument",
    "state": "{docs} documents counted into per-worker state, gathered at the end",
    "init": "a {init_s:g} s model load per worker, then {evals} evaluations of {eval_s:g} s",
    "returns": "{returns} tasks that return a new {return_mb:g} MB array",
    "gridsearch": "scikit-learn GridSearchCV through joblib ({grid_cs} x 3 fits)",
}


class WorkloadFailed(Exception):
    """The library raised inside the workload: ``name`` is its exception's class."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def is_workload(scenario: str) -> bool:
    return scenario.startswith(PREFIX)


def group_title(workload: str, size: dict[str, Any], workers: int) -> str:
    return f"workload: {TITLES[workload].format(**size)}, {workers} workers"


# Serial runs' ideals, in the order their trials ran: the ideal row of the same trial takes
# the oldest (runner.run runs every row's trial k before any row's trial k + 1).
_IDEALS: dict[str, list[float]] = {}


def ideal_s(parts: dict[str, Any], workers: int) -> float:
    """The ideal from a serial run's parts: the tasks spread over ``workers`` (no better than
    the longest task) plus the once-per-worker time plus the unavoidable copy."""
    tasks = parts["tasks"]
    spread = sum(tasks) / workers
    if not parts.get("divisible"):
        spread = max(spread, max(tasks, default=0.0))
    return spread + parts["fixed"] + parts["copy"]


def trial(library: str, workload: str, size: str, workers: int) -> float:
    """One trial of ``library`` on ``workload`` in a fresh interpreter: its seconds.
    PeerUnavailable when it is not installed, WorkloadFailed when it raised."""
    why = _libs.missing(library, workload)
    if why:
        raise PeerUnavailable(why)
    args = [library, workload, size, str(workers)]
    done = subprocess.run(
        [sys.executable, "-m", "fastpool._bench.workload_libs", *args],
        capture_output=True,
        text=True,
        timeout=TRIAL_TIMEOUT_S,
        check=False,
    )
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"workload process failed ({done.returncode}):\n{done.stderr[-2000:]}")
    got = json.loads(lines[-1])
    if "fails" in got:
        raise WorkloadFailed(got["fails"], got["message"])
    if library == _libs.SERIAL:
        _IDEALS.setdefault(workload, []).append(ideal_s(got["parts"], workers))
    return float(got["seconds"])


def ideal_trial(workload: str, size: str, workers: int) -> float:
    """The ideal of the serial trial that ran last before this one (one of its own if none)."""
    if not _IDEALS.get(workload):
        trial(_libs.SERIAL, workload, size, workers)
    return _IDEALS[workload].pop(0)


def cases(size: str = "full", workers: int = 2, libraries: list[str] | None = None) -> list[Case]:
    """The workloads section: every workload on every library (GridSearchCV on joblib's
    backends), then serial and ideal; ``size`` one of workload_libs.SIZES."""
    dims = _libs.SIZES[size]
    trials = TRIALS[size]
    names = libraries or list(_libs.LIBRARIES)
    out: list[Case] = []
    for workload in _libs.WORKLOADS:
        group = group_title(workload, dims, workers)
        fits = _libs.GRID_LIBRARIES if workload == "gridsearch" else _libs.MAP_LIBRARIES
        rows = [n for n in names if n in fits]
        if _libs.SERIAL not in rows:
            rows.append(_libs.SERIAL)
        for name in rows + [IDEAL]:
            fresh = (
                functools.partial(ideal_trial, workload, size, workers)
                if name == IDEAL
                else functools.partial(trial, name, workload, size, workers)
            )
            out.append(
                Case(
                    PREFIX + workload,
                    group,
                    name,
                    workers=workers,
                    kind="fresh",
                    rounds=trials,
                    warmup=0,
                    fresh=fresh,
                    extra={"workload": workload, "size": size},
                    processes=trials,
                )
            )
    return out


# ---- the table ------------------------------------------------------------------------------

REFERENCE_ROWS = (_libs.SERIAL, IDEAL)


def cell(r: Result) -> str:
    """What a row without a time shows: why."""
    error = r.error or ""
    if error.startswith("PeerUnavailable"):
        return "not installed"
    if error.startswith("WorkloadFailed"):
        return "fails: " + error.split(": ", 2)[1]
    return "error: " + error.split(":", 1)[0] if error else "no result"


def table(results: list[Result]) -> str:
    """Markdown: per workload, every row's median seconds, the spread of its trials, and
    its ratio to the best library's median and to the ideal's (above 1: slower)."""
    head = "| workload | library | median s | trials: min / max (n) | x best library | x ideal |"
    lines = [head, "|---|---|---:|---:|---:|---:|"]
    groups: OrderedDict[str, list[Result]] = OrderedDict()
    for r in results:
        if is_workload(r.scenario):
            groups.setdefault(r.group, []).append(r)
    for group, members in groups.items():
        timed = [r for r in members if r.rounds and not r.error]
        libs = [r for r in timed if r.peer not in REFERENCE_ROWS]
        best = min((r.median for r in libs), default=None)
        ideal = next((r.median for r in timed if r.peer == IDEAL), None)
        order = sorted(timed, key=lambda r: r.median) + [r for r in members if r not in timed]
        for i, r in enumerate(order):
            name = f"**{r.peer}**" if r.peer.startswith("fastpool") else r.peer
            if r not in timed:
                cells = [cell(r), "", "", ""]
            else:
                cells = [
                    f"{r.median:.2f}",
                    f"{min(r.rounds):.2f} / {max(r.rounds):.2f} ({len(r.rounds)})",
                    f"{r.median / best:.2f}x" if best and r.peer != IDEAL else "",
                    f"{r.median / ideal:.2f}x" if ideal and r.peer != IDEAL else "",
                ]
            lines.append("| " + " | ".join([group if i == 0 else "", name, *cells]) + " |")
    return "\n".join(lines)


def failures(results: list[Result]) -> list[Result]:
    """Rows the bench itself could not run (a crashed process, a wrong result): not a
    library that raised, not one that is not installed (those are the table's)."""
    return [
        r
        for r in results
        if is_workload(r.scenario)
        and r.error
        and not r.error.startswith(("WorkloadFailed", "PeerUnavailable"))
    ]


LEGEND = (
    "workloads (--section workloads; fastpool/_bench/workloads.py): seconds from the pool's "
    "construction to the end of its exit, the library imported and the inputs made before the "
    "clock, each trial in a fresh interpreter, the libraries' trials interleaved; x best "
    "library: the row's median over the fastest library's; x ideal: over the ideal's. serial: "
    "the loop in one process; ideal: that serial trial's task times spread over the workers "
    "(never below the longest task), plus the once-per-worker model load or refit, plus one "
    "copy of the image (the only copy a pool cannot avoid: the image into memory its workers "
    "see). state: fastpool.Pool gathers with Pool.run_on_workers, MPIRE with worker_exit, Ray "
    "from actors, Dask with client.run; the others have no per-worker state: their tasks return"
    " counts the caller merges. init: initializer= where the library has one, worker_state, "
    "actors, client.run; joblib loads the model in each worker's first task. Dask: a "
    "LocalCluster of single-threaded worker processes. fails: the library raised that "
    "exception."
)
