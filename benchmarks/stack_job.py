"""Issue 16's batch job: a 1 GiB float32 stack (256 frames of 1024 x 1024), 2 workers,
tried as a new user would, each way in a fresh process, the ways interleaved by round.

    python benchmarks/stack_job.py [ROUNDS]     prints one JSON line per run, then a table

    serial    the loop in this process
    share     stack loaded with NumPy, then pool.share(stack) (timed), then pool.map
    empty     loaded straight into pool.empty
    arrays    loaded with NumPy inside ``with pool.arrays()``
    byvalue   loaded with NumPy, its slices sent by value
    ppe       ProcessPoolExecutor (forkserver), slices pickled

The time runs from the loaded stack to the last result (share: its copy included); the
peak PSS (parent and workers, shared pages split) covers the load too. Each task takes
16 frames, as views of the stack; about 13 ms of NumPy work per frame.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np

FRAMES, H, W = 256, 1024, 1024
CHUNK = 16
WAYS = ("serial", "share", "empty", "arrays", "byvalue", "ppe")


def frame_stats(frames: np.ndarray) -> np.ndarray:
    out = np.empty(len(frames))
    for i, f in enumerate(frames):
        g = f - f.mean()
        a = np.abs(g)
        out[i] = float(
            np.sqrt(a).sum()
            + (g * g).sum()
            + np.exp(-g * g).sum()
            + np.cos(g).sum()
            + np.tanh(g).sum()
            + np.log1p(a).sum()
            + np.arctan(g).sum()
        )
    return out


def load(out: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(0)
    if out is None:
        return rng.random((FRAMES, H, W), dtype=np.float32)
    rng.random(out=out, dtype=np.float32)
    return out


def one(way: str) -> dict:
    import fastpool
    from fastpool._bench.memory import MemorySampler

    extra = {}
    with MemorySampler(0.01) as sampler:
        if way == "serial":
            stack, pool = load(), None
            t0 = time.perf_counter()
            parts = [frame_stats(stack[i : i + CHUNK]) for i in range(0, FRAMES, CHUNK)]
        else:
            if way == "ppe":
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"))
            else:
                pool = fastpool.Pool(2)
            list(pool.map(np.sum, [np.ones(1)] * 4))  # workers up and warm
            if way == "arrays":
                with pool.arrays():
                    stack = load()
            elif way == "empty":
                stack = load(pool.empty((FRAMES, H, W), np.float32))
            else:
                stack = load()
            t0 = time.perf_counter()
            if way == "share":
                stack = pool.share(stack)
                extra["share_s"] = time.perf_counter() - t0
            chunks = [stack[i : i + CHUNK] for i in range(0, FRAMES, CHUNK)]
            parts = list(pool.map(frame_stats, chunks, chunksize=1))
        took = time.perf_counter() - t0
        if pool is not None:
            pool.shutdown()
    check = float(np.concatenate(parts).sum())
    return dict(way=way, s=took, peak_pss_mib=sampler.peak_pss / 2**20, check=check, **extra)


def main(rounds: int) -> None:
    runs = []
    for _ in range(rounds):
        for way in WAYS:
            out = subprocess.run(
                [sys.executable, __file__, "--one", way], capture_output=True, text=True
            )
            if out.returncode:
                raise SystemExit(out.stderr)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    serial = {i: r["s"] for i, r in enumerate(runs) if r["way"] == "serial"}
    print("| way | median s (min-max) | x serial of the same round | peak PSS MiB |")
    print("|---|---:|---:|---:|")
    for k, way in enumerate(WAYS):
        mine = [(i, r) for i, r in enumerate(runs) if r["way"] == way]
        ts = sorted(r["s"] for _, r in mine)
        ratio = statistics.median(r["s"] / serial[i - k] for i, r in mine)
        pss = statistics.median(r["peak_pss_mib"] for _, r in mine)
        print(
            f"| {way} | {statistics.median(ts):.2f} ({ts[0]:.2f}-{ts[-1]:.2f}) "
            f"| {ratio:.2f} | {pss:,.0f} |"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])  # workers import frame_stats by name
        from stack_job import one as run_one

        print(json.dumps(run_one(sys.argv[2])))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
