"""The contention section of ``python -m fastpool bench`` (``--section contention``): the
machine as users have it, busy, with the load made by the bench itself, fastpool and the
peers in the same run.

    hogs          no-op round trip, 2 workers, with one CPU hog per usable CPU running
                  (load.hogs: ``while True: pass`` in new interpreters, ended by pid)
    programs      three programs at once, each a new interpreter with its own pool of 2,
                  timing round trips over the same second: the slowest program's median
    oversub       no-op round trip on a pool of OVERSUBSCRIBE x the usable CPUs
    spin-map      SPIN_TASKS tasks of SPIN_TASK_S of CPU, map(chunksize=1), 2 workers:
                  wall time (ideal: SPIN_TASKS x SPIN_TASK_S / 2)
    idle-N        an idle pool of N (IDLE_WORKERS): CPU seconds per second of this process
                  and every process under it, after a settle
    batch-peak    BATCH_SLICES slices of a float32 array by value through map(chunksize=1)
                  (standardise, clip, soft-threshold) into a faulted output array: the PSS
                  the pool added at its peak
    batch-held    the same batch: the PSS it still holds BATCH_SETTLE_S after the map

Every id starts with "contention-" (``--only contention-idle``). The rows run in fresh
processes of their own (Case.process_group), at most PROCESSES of them per peer: a few
minutes in all on two cores. Idle and memory rows hold values, not times (Case.kind
"value"): lower is better there too, so "x mp.Pool" reads the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fastpool._bench import load, tasks
from fastpool._bench.peers import TASK_PEERS, Peer
from fastpool._bench.scenarios import Case, round_trip

WORKERS = 2
PROGRAMS = 3
PROGRAM_S = 1.0
OVERSUBSCRIBE = 4
SPIN_TASKS = 400
SPIN_TASK_S = 0.005
IDLE_WORKERS = (2, 8, 16)
IDLE_SETTLE_S = 0.5  # after the warm-up's last task: the pool's own wind-down is not idle
IDLE_WINDOW_S = 2.0
BATCH_MIB = 2048
BATCH_MIN_MIB = 32
BATCH_SLICES = 32
BATCH_SETTLE_S = 0.5
BATCH_PROCESSES = 2  # a 2 GiB batch takes tens of seconds a process: the section's longest rows
PROCESSES = 3
# --quick (--section contention --quick): about 100 s on two cores, quiet (the whole
# quick run took 154 s with this section and 52 s without it, at de36218): not in --quick
# alone, which runs the quiet section
QUICK = {
    "calls": 50,
    "rounds": 2,
    "program_s": 0.5,
    "spin_tasks": 100,
    "idle_window_s": 1.0,
    "batch_mib": 256,
    "processes": 2,
}
FULL = {
    "calls": 100,
    "rounds": 6,
    "program_s": PROGRAM_S,
    "spin_tasks": SPIN_TASKS,
    "idle_window_s": IDLE_WINDOW_S,
    "batch_mib": BATCH_MIB,
    "processes": PROCESSES,
}


def usable_cpus() -> int:
    from fastpool._supervision import _sizing

    return _sizing.usable_cpus()


def batch_mib(quick: bool = False) -> int:
    """The batch's array, MiB: BATCH_MIB (256 with --quick), less where the machine has less.
    The batch needs the array, the output and what the pool adds (about the array again):
    at most a sixth of the memory available now, a multiple of BATCH_SLICES MiB."""
    import psutil

    want = (QUICK if quick else FULL)["batch_mib"]
    fits = psutil.virtual_memory().available // 6 // 2**20
    size = min(want, fits) // BATCH_SLICES * BATCH_SLICES
    return max(BATCH_MIN_MIB, size)


# ---- group titles -------------------------------------------------------------------------


def hogs_group(hogs: int) -> str:
    return f"contention: no-op round trip, {WORKERS} workers, {hogs} CPU hogs running"


def programs_group() -> str:
    return (
        f"contention: {PROGRAMS} programs at once, each its own pool of {WORKERS}: "
        "the slowest one's round trip"
    )


def oversub_group(workers: int, cpus: int) -> str:
    return f"contention: no-op round trip on a pool of {workers} ({cpus} usable CPUs)"


def spin_group(n: int) -> str:
    ideal = n * SPIN_TASK_S / WORKERS
    return (
        f"contention: map of {n} tasks of {SPIN_TASK_S * 1e3:g} ms CPU, chunksize=1, "
        f"{WORKERS} workers (ideal {ideal:.2f} s)"
    )


def idle_group(workers: int) -> str:
    return f"idle: a pool of {workers} doing nothing: CPU time per second, parent and workers"


def batch_group(mib: int, what: str) -> str:
    return (
        f"memory: {BATCH_SLICES} slices of a {mib:,} MiB float32 array by value, "
        f"map(chunksize=1): {what}"
    )


# ---- the calls ----------------------------------------------------------------------------


def spin_map(peer: Peer, n: int) -> Callable[[], list]:
    def call() -> list:
        return peer.map(tasks.cpu_spin, [SPIN_TASK_S] * n, 1)

    return call


def idle(peer: Peer, window_s: float) -> Callable[[], dict[str, float]]:
    def call() -> dict[str, float]:
        got = load.idle_cpu(IDLE_SETTLE_S, window_s)
        return {"value": got["total"], "parent": got["parent"], "workers": got["workers"]}

    return call


class Batch:
    """One process's batch rows: the array and the faulted output, made once (outside any
    baseline), and the held figures the peak row's rounds leave for the held row's."""

    def __init__(self, mib: int) -> None:
        self.mib = mib
        self.held: list[dict[str, Any]] = []
        self._arrays: tuple[Any, Any] | None = None

    def arrays(self) -> tuple[Any, Any]:
        if self._arrays is None:
            import numpy as np

            arr = np.random.default_rng(7).random(self.mib * 2**20 // 4, dtype=np.float32)
            out = np.empty_like(arr)
            out.fill(0.0)  # faulted: the baseline holds it, so the batch's figures are the pool's
            self._arrays = arr, out
        return self._arrays

    def run(self, peer: Peer) -> dict[str, Any]:
        arr, out = self.arrays()
        got = load.batch_memory(peer, arr, out, BATCH_SLICES, BATCH_SETTLE_S)
        return {**got, **load.held_stats(peer)}

    def peak(self, peer: Peer) -> Callable[[], dict[str, Any]]:
        def call() -> dict[str, Any]:
            got = self.run(peer)
            self.held.append(got)
            return {"value": got["peak_mib"], **_others(got, "peak_mib")}

        return call

    def still_held(self, peer: Peer) -> Callable[[], dict[str, Any]]:
        def call() -> dict[str, Any]:
            got = self.held.pop(0) if self.held else self.run(peer)  # run alone: its own batch
            return {"value": got["held_mib"], **_others(got, "held_mib")}

        return call


def _others(got: dict[str, Any], value: str) -> dict[str, Any]:
    return {k: v for k, v in got.items() if k != value}


def _check_spin(got: list, n: int) -> None:
    # cpu_spin returns thread_time() differences: a float sum can land a ulp under SPIN_TASK_S
    assert len(got) == n and min(got) >= SPIN_TASK_S * 0.999, "the spin map returned wrong results"


# ---- the catalogue ------------------------------------------------------------------------


def cases(peers: list[str], quick: bool = False, mib: int | None = None) -> list[Case]:
    """The contention section for ``peers`` (task peers only), in running order."""
    size = QUICK if quick else FULL
    cpus = usable_cpus()
    mib = mib or batch_mib(quick)
    runs = [p for p in peers if p in TASK_PEERS]
    processes, rounds, calls = size["processes"], size["rounds"], size["calls"]
    few = max(1, processes)  # rows of seconds each: one round per process
    out: list[Case] = []
    common = {"process_group": "contention", "processes": processes}
    for p in runs:
        out.append(
            Case(
                "contention-hogs",
                hogs_group(cpus),
                p,
                workers=WORKERS,
                kind="latency",
                build=round_trip,
                rounds=rounds,
                calls=calls,
                around=functools.partial(load.hogs, cpus),
                extra={"hogs": cpus},
                **common,
            )
        )
    for p in runs:
        out.append(
            Case(
                "contention-programs",
                programs_group(),
                p,
                workers=WORKERS,
                kind="fresh",
                rounds=few,
                warmup=0,
                fresh=functools.partial(_slowest, p, size["program_s"]),
                extra={"programs": PROGRAMS},
                processes=processes,
            )
        )
    big = OVERSUBSCRIBE * cpus
    for p in runs:
        out.append(
            Case(
                "contention-oversub",
                oversub_group(big, cpus),
                p,
                workers=big,
                kind="latency",
                build=round_trip,
                rounds=rounds,
                calls=calls,
                **common,
            )
        )
    n = size["spin_tasks"]
    for p in runs:
        out.append(
            Case(
                "contention-spin-map",
                spin_group(n),
                p,
                workers=WORKERS,
                build=functools.partial(spin_map, n=n),
                check=functools.partial(_check_spin, n=n),
                ops=n,
                unit="tasks/s",
                rounds=few,
                **common,
            )
        )
    for w in IDLE_WORKERS:
        for p in runs:
            out.append(
                Case(
                    f"contention-idle-{w}",
                    idle_group(w),
                    p,
                    workers=w,
                    kind="value",
                    value_unit="CPU s/s",
                    build=functools.partial(idle, window_s=size["idle_window_s"]),
                    rounds=few,
                    warmup=0,
                    **common,
                )
            )
    for p in runs:
        batch = Batch(mib)
        for scenario, what, build in (
            ("contention-batch-peak", "PSS added at the peak", batch.peak),
            (
                "contention-batch-held",
                f"PSS still added {BATCH_SETTLE_S:g} s after the map",
                batch.still_held,
            ),
        ):
            out.append(
                Case(
                    scenario,
                    batch_group(mib, what),
                    p,
                    workers=WORKERS,
                    kind="value",
                    value_unit="MiB",
                    build=build,
                    rounds=few,
                    warmup=0,
                    extra={"batch_mib": mib, "slices": BATCH_SLICES},
                    process_group="batch",
                    processes=min(processes, BATCH_PROCESSES),
                )
            )
    return out


def _slowest(peer: str, seconds: float) -> float:
    return max(load.programs_at_once(peer, PROGRAMS, WORKERS, seconds))
