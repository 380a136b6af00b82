"""Issue 24's batch of slices: what a pool adds to memory while a batch runs, and what it
still holds after, for each pool in a fresh process, the pools interleaved by round.

    python benchmarks/slice_batch.py [ROUNDS] [GIB]   one JSON line per run, then a table

A GIB float32 array (default 2) is cut into 32 slices, sent by value through
``pool.map(step, slices, chunksize=1)`` with 2 workers (standardise, clip,
soft-threshold), each result copied into an output array.  The pool is started and
warm, and the input and output arrays are faulted in, before the baseline PSS (parent
and workers, shared pages split); ``peak`` is the highest PSS sum during the map,
``held`` the sum 0.5 s after it, both minus the baseline: what the pool added.  For
fastpool the line also carries ``pool.stats()["arena"]`` after the map, and the
shared-memory PSS of each process (``/proc/PID/smaps_rollup``, Pss_Shmem).

    fastpool  fastpool.Pool(2)
    ppe       concurrent.futures.ProcessPoolExecutor(2)
    mp        multiprocessing.Pool(2)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SLICES = 32
WAYS = ("fastpool", "ppe", "mp")


def step(x: np.ndarray) -> np.ndarray:
    z = (x - x.mean()) / (x.std() + 1e-12)
    np.clip(z, -3.0, 3.0, out=z)
    return np.sign(z) * np.maximum(np.abs(z) - 0.5, 0.0)


def _pss_shmem_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss_Shmem:"):
                return int(line.split()[1]) / 1024
    return 0.0


def one(way: str, gib: float) -> dict:
    from fastpool._bench.memory import MemorySampler

    if way == "fastpool":
        import fastpool

        pool = fastpool.Pool(2)
    elif way == "ppe":
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(2)
    else:
        import multiprocessing

        pool = multiprocessing.Pool(2)
    list(pool.map(np.sum, [np.ones(1)] * 4))  # workers up and warm
    n = int(gib * (1 << 30)) // 4 // SLICES * SLICES
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    out = np.ones_like(x)  # faulted before the baseline: the output is the user's, not the pool's
    per = n // SLICES
    slices = [x[i * per : (i + 1) * per] for i in range(SLICES)]
    sampler = MemorySampler(0.01)
    with sampler:
        t0 = time.perf_counter()
        for i, r in enumerate(pool.map(step, slices, chunksize=1)):
            out[i * per : (i + 1) * per] = r
            del r
        took = time.perf_counter() - t0
    time.sleep(0.5)
    _, held = sampler.sample()
    extra: dict = {}
    if way == "fastpool":
        extra["arena"] = pool.stats().get("arena")
        extra["pss_shmem_mib"] = {
            str(pid): round(_pss_shmem_mib(pid), 1) for pid in [os.getpid(), *pool.pids()]
        }
    if hasattr(pool, "shutdown"):
        pool.shutdown()
    else:
        pool.close()
        pool.join()
    mib = 1 << 20
    return dict(
        way=way,
        s=round(took, 2),
        baseline_mib=round(sampler.baseline_pss / mib),
        peak_added_mib=round((sampler.peak_pss - sampler.baseline_pss) / mib),
        held_added_mib=round((held - sampler.baseline_pss) / mib),
        load=os.getloadavg()[0],
        **extra,
    )


def main(rounds: int, gib: float) -> None:
    runs = []
    for _ in range(rounds):
        for way in WAYS:
            out = subprocess.run(
                [sys.executable, __file__, "--one", way, str(gib)], capture_output=True, text=True
            )
            if out.returncode:
                raise SystemExit(out.stderr)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    print("| pool | peak added MiB (min-max) | held 0.5 s after MiB (min-max) | s |")
    print("|---|---:|---:|---:|")
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        p = sorted(r["peak_added_mib"] for r in mine)
        h = sorted(r["held_added_mib"] for r in mine)
        s = statistics.median(r["s"] for r in mine)
        print(
            f"| {way} | {statistics.median(p):,.0f} ({p[0]:,}-{p[-1]:,}) "
            f"| {statistics.median(h):,.0f} ({h[0]:,}-{h[-1]:,}) | {s:.2f} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])  # workers import step by name
        from slice_batch import one as run_one

        print(json.dumps(run_one(sys.argv[2], float(sys.argv[3]))))
    else:
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 3,
            float(sys.argv[2]) if len(sys.argv) > 2 else 2.0,
        )
