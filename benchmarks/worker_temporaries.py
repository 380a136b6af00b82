"""Issue 31, item 4: what a task's own arrays cost in a worker, against the same task in a
``ProcessPoolExecutor`` worker (glibc malloc, NumPy's huge-page advice).

    python benchmarks/worker_temporaries.py [ROUNDS] [WAYS]   one JSON line per run, then a table

Each run is a fresh process with one worker, the ways interleaved by round.  Workloads
(each call sequential, back to back):

    double    ``return a * 2`` on an 80 MiB float64 array (fastpool: ``pool.share``d once;
              PPE: pickled, its idiom), 20 calls: a large result every call
    convolve  ``ndimage.convolve`` of a 50 MB float64 image with a 5x5 kernel, standardised,
              returns ``float(np.abs(z).max())``, 10 calls: 50 MB temporaries (about
              200 MB freed a call), a small result
    medium    80 temporaries of 4 MiB (``np.sqrt(x * 1.5 + 2)`` on slices), returns a float,
              10 calls: many medium temporaries

Measured in the worker around the task's body (``resource.getrusage``): user+sys CPU
and minor page faults, so a loaded machine moves the CPU time less than the wall time;
and over the whole run for the worker process (``/proc/PID/stat``): what trims, the
result's encoding and (PPE) pickling add.  The first call of each run is a warm-up,
left out.  Ways: ``fastpool``, ``fastpool-nohook`` (``FASTPOOL_NUMPY_HOOK=0``: NumPy
allocates with malloc in the worker, results are copied into shared memory), ``ppe``.
Set ``PYTHONPATH`` to compare another build (the A/B runs of the commit message).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

WORKLOADS = {"double": 20, "convolve": 10, "medium": 10}
_STATS: list[tuple[float, int]] = []  # per call in this worker: (cpu s, minor faults)


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def _measured(body, name):
    def task(*args):
        c0, f0 = _usage()
        out = body(*args)
        c1, f1 = _usage()
        _STATS.append((c1 - c0, f1 - f0))
        return out

    task.__name__ = task.__qualname__ = name  # pickled by reference, under this name
    return task


def _double(a: np.ndarray) -> np.ndarray:
    return a * 2


def _convolve(img: np.ndarray) -> float:
    from scipy import ndimage

    r = ndimage.convolve(img, np.full((5, 5), 1 / 25))
    z = (r - r.mean()) / r.std()
    return float(np.abs(z).max())


def _medium(img: np.ndarray) -> float:
    flat = img.reshape(-1)
    step = (4 << 20) // 8
    s = 0.0
    for i in range(80):
        j = (i * step) % (flat.size - step)
        t = np.sqrt(flat[j : j + step] * 1.5 + 2.0)
        s += float(t[0])
        del t
    return s


double = _measured(_double, "double")
convolve = _measured(_convolve, "convolve")
medium = _measured(_medium, "medium")


def stats() -> list[tuple[float, int]]:
    out = list(_STATS)
    _STATS.clear()
    return out


def _proc(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[7])


def one(way: str, workload: str) -> dict:
    n = WORKLOADS[workload]
    if workload == "double":
        x = np.random.default_rng(0).random((80 << 20) // 8)
    else:
        x = np.random.default_rng(0).random((2500, 2500))  # 50 MB
    fn = {"double": double, "convolve": convolve, "medium": medium}[workload]
    if way.startswith("fastpool"):
        import fastpool

        pool = fastpool.Pool(1)
        arg = pool.share(x)
        pid = pool.pids()[0]
    else:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(1)
        arg = x
        pool.submit(stats).result()
        pid = next(iter(pool._processes))
    pool.submit(fn, arg).result()  # warm-up: imports, first pages
    pool.submit(stats).result()
    w0 = _proc(pid)
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = pool.submit(fn, arg).result()
        walls.append(time.perf_counter() - t0)
        del r
    w1 = _proc(pid)
    body = pool.submit(stats).result()
    pool.shutdown()
    ms = 1e3
    return dict(
        way=way,
        workload=workload,
        wall_ms=round(statistics.median(walls) * ms, 1),
        body_cpu_ms=round(statistics.median(c for c, _ in body) * ms, 1),
        body_faults=int(statistics.median(f for _, f in body)),
        worker_cpu_ms=round((w1[0] - w0[0]) / n * ms, 1),
        worker_faults=(w1[1] - w0[1]) // n,
        load=round(os.getloadavg()[0], 1),
    )


def main(rounds: int, ways: list[str]) -> None:
    runs = []
    for _ in range(rounds):
        for workload in WORKLOADS:
            for way in ways:
                env = dict(os.environ)
                if way == "fastpool-nohook":
                    env["FASTPOOL_NUMPY_HOOK"] = "0"
                label = way.split("@")[0]
                if "@" in way:  # another build: fastpool@/path/to/checkout
                    env["PYTHONPATH"] = way.split("@", 1)[1]
                out = subprocess.run(
                    [sys.executable, __file__, "--one", label, workload],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if out.returncode:
                    raise SystemExit(out.stderr)
                runs.append(dict(json.loads(out.stdout.strip().splitlines()[-1]), way=way))
                print(json.dumps(runs[-1]), flush=True)
    keys = ("wall_ms", "body_cpu_ms", "body_faults", "worker_cpu_ms", "worker_faults")
    print("| workload | way | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for workload in WORKLOADS:
        for way in ways:
            mine = [r for r in runs if r["workload"] == workload and r["way"] == way]
            cells = []
            for k in keys:
                v = sorted(r[k] for r in mine)
                cells.append(f"{statistics.median(v):g} ({v[0]:g}-{v[-1]:g})")
            print(f"| {workload} | {way} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])  # workers import the tasks by name
        from worker_temporaries import one as run_one

        print(json.dumps(run_one(sys.argv[2], sys.argv[3])))
    else:
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 3,
            sys.argv[2].split(",") if len(sys.argv) > 2 else ["fastpool", "fastpool-nohook", "ppe"],
        )
