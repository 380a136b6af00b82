"""``python -m fastpool demo``: why fastpool exists, measured side by side with
multiprocessing.Pool in this run, on this machine (about 10 s on two cores).

    1. many small tasks     no-op round trips (median, p99) and SUBMITS individual submits
    2. a 256 MiB array job  one shared input, workers writing their slice of a shared output
                            (pool.empty), against the same job with arrays passed by value
                            (multiprocessing.Pool, and fastpool too); time and extra PSS
    3. compute-bound work   a NumPy batch job where the work dominates: pools tie, honestly
    4. supervision          a SIGKILL, a segfault, a timeout and a memory kill, each failing
                            one future with its own error while the pool carries on; the
                            same SIGKILL on multiprocessing.Pool, for contrast
    5. cleanup              no /dev/shm file, no worker left
    summary                 every ratio above, from this run's measurements, and the regime:
                            the machine's load (load average, runnable processes) at the
                            start and at the end, "busy" if either was

Every result is checked bit for bit against the same computation in this process.
Functions the workers run live at module level here, so both pools unpickle them by
name under any start method. ``run_demo`` returns 0 when every check passed, else 1.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TextIO

import numpy as np

from fastpool._bench import tasks
from fastpool._bench.env import busy_warning, describe_load, machine_load
from fastpool.cli._demo_parts import (
    RESULT_WAIT_S,
    SPIN_LIMIT_S,
    Checks,
    alive,
    die_by_segfault,
    die_by_sigkill,
    hog_memory,
    make_batches,
    outcome,
    process_batch,
    same_results,
    shared_mappings,
    spin,
    wait_healed,
)
from fastpool.errors import _SIGKILL_HINT as SIGKILL_HINT

# One BLAS thread per process (cli/__init__ sets them before NumPy loads): the pools are
# compared, not BLAS configurations, and every process computes the same bits.
BLAS_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
ROUND_TRIPS = 500
SUBMITS = 5_000
ARRAY_MIB = 256
BATCHES = 32
TASK_TIMEOUT_S = 0.5
MEMORY_LIMIT = "256MiB"
MP_CRASH_WAIT_S = 1.0
PSS_INTERVAL_S = 0.02  # sampling PSS costs ~0.2 ms a process: every 20 ms keeps it off the timing


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes for both pools (default: the CPUs this process may use)",
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    return run_demo(args.workers)


def job_chunk(src: np.ndarray) -> np.ndarray:
    """The array job on a chunk, by value: ``sqrt(x) * 0.5 + x``, a new array back.

    Correctly rounded operations only, so any chunking gives the same bits."""
    out = np.sqrt(src)
    out *= 0.5
    out += src
    return out


def job_fill(src: np.ndarray, out: np.ndarray, lo: int, hi: int) -> int:
    """The same job written into ``out[lo:hi]``: with shared arrays nothing travels back."""
    np.sqrt(src[lo:hi], out=out[lo:hi])
    out[lo:hi] *= 0.5
    out[lo:hi] += src[lo:hi]
    return hi - lo


def _timed(run: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = run()
    return time.perf_counter() - t0, result


def _pss(run: Callable[[], Any]) -> tuple[float, Any, float]:
    """(seconds, result, MiB of PSS the call added to this process and its workers)."""
    from fastpool._bench.memory import MemorySampler

    with MemorySampler(PSS_INTERVAL_S) as sampler:
        seconds, result = _timed(run)
    return seconds, result, (sampler.peak_pss - sampler.baseline_pss) / 2**20


def said(exc: BaseException | None) -> str:
    """What the demo prints of a supervision task's error: fastpool's message, whose guess
    at who sent a SIGKILL (often the OOM killer) gives way to who did: the task itself."""
    return str(exc).replace(SIGKILL_HINT, "the task sent it to its own worker (os.kill)")


def _latencies(call: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return sorted(out)


def _faster(ratio: float, what: str = "") -> str:
    """``2.1x faster`` or ``1.3x slower``: a ratio of times, other over fastpool's."""
    word = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return f"{word}{' ' + what if what else ''}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds >= 1e-4 else f"{seconds * 1e6:.1f} µs"


def small_tasks(
    say: Callable[..., None], check: Checks, fp: Any, mp: Any, summary: list[str]
) -> tuple[float, float]:
    """Returns the median round trips (fastpool, multiprocessing.Pool), in seconds."""
    say("1. Many small tasks: the cost of one task, nothing to compute")
    for call in (lambda: mp.apply_async(tasks.noop).get(), lambda: fp.submit(tasks.noop).result()):
        for _ in range(50):
            call()  # warm
    mp_lat = _latencies(lambda: mp.apply_async(tasks.noop).get(), ROUND_TRIPS)
    fp_lat = _latencies(lambda: fp.submit(tasks.noop).result(), ROUND_TRIPS)
    p99 = lambda lat: lat[int(0.99 * len(lat))]  # noqa: E731
    for name, lat in (("multiprocessing.Pool", mp_lat), ("fastpool.Pool", fp_lat)):
        say(
            f"   round trip, submit then wait  {name:<22} median {_us(statistics.median(lat)):>9}  "
            f"p99 {_us(p99(lat)):>9}"
        )
    rt = statistics.median(mp_lat) / statistics.median(fp_lat)
    say(
        f"   -> round trip: fastpool {_faster(rt)} at the median, "
        f"{_faster(p99(mp_lat) / p99(fp_lat))} at p99"
    )
    want = [i * i for i in range(SUBMITS)]
    mp_s, mp_got = _timed(
        lambda: [f.get() for f in [mp.apply_async(tasks.square, (i,)) for i in range(SUBMITS)]]
    )
    fp_s, fp_got = _timed(
        lambda: [f.result() for f in [fp.submit(tasks.square, i) for i in range(SUBMITS)]]
    )
    for name, secs in (("multiprocessing.Pool", mp_s), ("fastpool.Pool", fp_s)):
        say(f"   {SUBMITS:,} submits, then wait   {name:<22} {SUBMITS / secs:9,.0f} tasks/s")
    say(f"   -> {SUBMITS:,} individual submits: fastpool {_faster(mp_s / fp_s)}")
    check(mp_got == want and fp_got == want, f"all {SUBMITS:,} results right on both pools")
    summary += [
        f"no-op round trip           {_faster(rt)} ({_us(statistics.median(fp_lat))} vs "
        f"{_us(statistics.median(mp_lat))} at the median)",
        f"{SUBMITS:,} individual submits  {_faster(mp_s / fp_s)} ({SUBMITS / fp_s:,.0f} vs "
        f"{SUBMITS / mp_s:,.0f} tasks/s)",
    ]
    return statistics.median(fp_lat), statistics.median(mp_lat)


def array_job(
    say: Callable[..., None], check: Checks, fp: Any, mp: Any, workers: int, summary: list[str]
) -> None:
    n = ARRAY_MIB * 2**20 // 8
    k = 2 * workers
    bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]
    say(f"2. A {ARRAY_MIB} MiB array job: out = sqrt(x) * 0.5 + x over float64 x, in {k} chunks")
    rng = np.random.default_rng(7)
    x = rng.random(n)
    job_chunk(x[: n // 8])  # the allocator's first big blocks are fresh pages; not the job's cost
    serial_s, reference = _timed(lambda: job_chunk(x))
    say(
        f"   in this process, one core            {serial_s:7.3f} s   (the compute alone; "
        f"its output adds {ARRAY_MIB} MiB)"
    )
    rows: list[tuple[str, float, float]] = []

    def by_value_mp() -> np.ndarray:
        return np.concatenate(mp.map(job_chunk, [x[lo:hi] for lo, hi in bounds], 1))

    def by_value_fp() -> np.ndarray:
        return np.concatenate(list(fp.map(job_chunk, [x[lo:hi] for lo, hi in bounds], chunksize=1)))

    src = fp.empty(n)  # where the data would be made in the first place
    src[...] = x

    def shared_fp() -> np.ndarray:
        out = fp.empty(n)
        futures = [fp.submit(job_fill, src, out, lo, hi) for lo, hi in bounds]
        assert sum(f.result(timeout=RESULT_WAIT_S) for f in futures) == n
        return out

    outputs = {}
    for name, call in (
        ("multiprocessing.Pool, by value", by_value_mp),
        ("fastpool.Pool, by value", by_value_fp),
        ("fastpool.Pool, shared in and out", shared_fp),
    ):
        secs, out, extra = _pss(call)
        outputs[name] = out
        rows.append((name, secs, extra))
        say(f"   {name:<37}{secs:7.3f} s   +{extra:6,.0f} MiB PSS")
        del out
    say(
        f"   (+PSS: the call's peak over its start. Each call makes a new {ARRAY_MIB} MiB output, "
        "shared or not; the peak can read above it while the workers map the input's pages, "
        "PSS being read one process at a time)"
    )
    (mp_name, mp_s, mp_mb), _, (_, sh_s, sh_mb) = rows
    check(
        all(np.array_equal(o, reference) for o in outputs.values()),
        "outputs identical",
        "every pool's output == the in-process one, bit for bit",
    )
    outputs.clear()
    say(
        f"   -> shared arrays: {_faster(mp_s / sh_s, 'than multiprocessing.Pool')}, "
        f"+{sh_mb:,.0f} MiB of memory instead of +{mp_mb:,.0f} MiB; "
        f"{_faster(serial_s / sh_s, 'than the compute alone on one core')}"
    )
    summary.append(
        f"{ARRAY_MIB} MiB array job         {_faster(mp_s / sh_s)} with shared arrays, "
        f"+{sh_mb:,.0f} MiB PSS vs +{mp_mb:,.0f} MiB by value"
    )


def compute_bound(
    say: Callable[..., None],
    check: Checks,
    fp: Any,
    mp: Any,
    batches: list[np.ndarray],
    reference: list,
    serial_s: float,
    hops: tuple[float, float],
    summary: list[str],
) -> None:
    say(
        f"3. Compute-bound: process_batch over {len(batches)} batches of 384 x 512 (FFT, Gram "
        "eigenvalues), chunksize=1"
    )
    mp_s, mp_res = _timed(lambda: mp.map(process_batch, batches, 1))
    fp_s, fp_res = _timed(lambda: list(fp.map(process_batch, batches, chunksize=1)))
    for name, secs in (("multiprocessing.Pool", mp_s), ("fastpool.Pool", fp_s)):
        say(f"   {name:<37}{secs:7.3f} s   {len(batches) / secs:6.1f} batches/s")
    task_s = serial_s / len(batches)
    say(f"   in this process, one core            {serial_s:7.3f} s")
    say(
        f"   -> fastpool {_faster(mp_s / fp_s)}. Each task computes for {task_s * 1e3:.1f} ms, "
        f"{task_s / hops[0]:,.0f}x fastpool's round trip and {task_s / hops[1]:,.0f}x "
        "multiprocessing.Pool's: the pools' own costs are small here, and what is left is the "
        "cores (and whatever else runs on them)"
    )
    check(
        same_results(fp_res, reference) and same_results(mp_res, reference),
        "results identical",
        "fastpool == multiprocessing.Pool == in-process, bit for bit",
    )
    summary.append(
        f"compute-bound batches      {_faster(mp_s / fp_s)} ({task_s * 1e3:.0f} ms tasks: "
        "the work dominates)"
    )


def supervision(
    say: Callable[..., None],
    check: Checks,
    workers: int,
    batches: list[np.ndarray],
    reference: list,
    summary: list[str],
) -> list[int]:
    import fastpool
    from fastpool import TaskTimeout, WorkerCrashed, WorkerMemoryError

    say(
        f"4. Supervision: 4 tasks that kill their worker, among 6 normal ones "
        f"(Pool(memory_limit={MEMORY_LIMIT!r}), options(timeout={TASK_TIMEOUT_S}) for spin)"
    )
    with fastpool.Pool(
        workers, blas_threads=1, memory_limit=MEMORY_LIMIT, memory_interval_s=0.02
    ) as pool:
        pool.submit(int).result(timeout=RESULT_WAIT_S)
        wait_healed(pool, 0, workers)
        before = sorted(pool.pids())
        bad: dict[str, tuple[Future, type, str]] = {
            "die_by_sigkill()": (pool.submit(die_by_sigkill), WorkerCrashed, "SIGKILL"),
            "die_by_segfault()": (pool.submit(die_by_segfault), WorkerCrashed, "SIGSEGV"),
            "spin()": (
                pool.options(timeout=TASK_TIMEOUT_S).submit(spin, SPIN_LIMIT_S),
                TaskTimeout,
                "",
            ),
            "hog_memory()": (pool.submit(hog_memory), WorkerMemoryError, "memory"),
        }
        good = [(i, pool.submit(process_batch, batches[i])) for i in range(6)]
        for label, (fut, want, word) in bad.items():
            status, exc = outcome(fut)
            say(f"   {label:<19} -> {type(exc).__name__ if exc else 'completed'}: {said(exc)}")
            check(type(exc) is want and word in str(exc), f"{label} failed with {want.__name__}")
        got = [
            fut.result(timeout=RESULT_WAIT_S)
            for _, fut in good
            if fut.exception(timeout=RESULT_WAIT_S) is None
        ]
        check(
            len(got) == len(good) and same_results(got, [reference[i] for i, _ in good]),
            "the 6 normal tasks completed with the right results",
        )
        healed = wait_healed(pool, 4, workers)
        after = pool.submit(process_batch, batches[7]).result(timeout=RESULT_WAIT_S)
        stats = pool.stats()
        say(
            f"   workers before {before}, after {sorted(pool.pids())}; "
            f"restarts {stats['restarts']}, "
            f"crash records {len(stats['crashes'])} (pool.stats()['crashes'])"
        )
        check(
            healed and same_results([after], [reference[7]]),
            f"all 4 dead workers replaced, {workers} ready, the pool computes correctly",
        )
        last = sorted(pool.pids())
        shm, with_memfd = shared_mappings(last)
    summary.append("supervision                4 kills -> 4 specific errors, 0 other tasks lost")
    return last if not shm and with_memfd == len(last) else []


def mp_crash(say: Callable[..., None], workers: int, summary: list[str]) -> None:
    say("   the same SIGKILL on multiprocessing.Pool:")
    mp = multiprocessing.get_context("fork").Pool(workers)
    try:
        t0 = time.monotonic()
        try:
            mp.apply_async(die_by_sigkill).get(timeout=MP_CRASH_WAIT_S)
            text = "completed?"
        except multiprocessing.TimeoutError:
            waited = time.monotonic() - t0
            text = (
                f"no error and no result: still waiting after {waited:.1f} s "
                "(the pool replaced the worker and lost the task)"
            )
            summary.append(
                "multiprocessing.Pool       the same SIGKILL: no error, "
                f"no result after {waited:.1f} s"
            )
        say(f"   die_by_sigkill()    -> {text}")
    finally:
        mp.terminate()
        mp.join()


def regime_report(start: dict[str, Any], end: dict[str, Any]) -> tuple[str, list[str]]:
    """(regime, summary lines) from env.machine_load() at the start and at the end: "busy"
    if either was, since a load that came or went during the run was in its timings."""
    regime = "busy" if "busy" in (start["regime"], end["regime"]) else "quiet"
    lines = [
        f"regime: {regime} (at the start: {describe_load(start)};",
        f"        at the end: {describe_load(end)})",
    ]
    if regime == "busy":
        lines.append(
            "other programs shared the CPUs: the ratios above are this load's, not a quiet "
            "machine's (docs/quickstart.md gives both)"
        )
    return regime, lines


def run_demo(workers: int | None = None, out: TextIO = sys.stdout) -> int:
    """Runs the whole demo, writing to ``out``.  Returns 0 if every check passed, else 1."""
    import fastpool
    from fastpool._supervision import _sizing

    t_start = time.perf_counter()
    say = lambda text="": (out.write(text + "\n"), out.flush())  # noqa: E731
    check = Checks(out)
    quiet = logging.NullHandler()  # the pool logs each crash at ERROR; the demo prints them itself
    logging.getLogger("fastpool").addHandler(quiet)
    logging.getLogger("fastpool").propagate = False
    workers = workers or _sizing.default_workers()
    summary: list[str] = []
    load_start: dict[str, Any] = {"regime": "quiet"}
    try:
        blas = ", ".join(f"{v}={os.environ.get(v, 'unset')}" for v in BLAS_ENV_VARS)
        say(
            f"fastpool {fastpool.__version__} demo: {workers} workers for both pools "
            f"({_sizing.usable_cpus()} usable CPUs); {blas}"
        )
        load_start = machine_load()
        say(f"machine at the start: {describe_load(load_start)}")
        busy = busy_warning()
        if busy:
            say(busy)  # the same threshold as the regime's; this says what it does to timings
        batches = make_batches(BATCHES)
        process_batch(batches[0])  # the first call pays FFT and LAPACK set-up
        serial_s, reference = _timed(lambda: [process_batch(b) for b in batches])
        say()
        # multiprocessing.Pool first: it forks now, while this process runs no thread.
        mp = multiprocessing.get_context("fork").Pool(workers)
        try:
            with fastpool.Pool(workers, blas_threads=1) as fp:
                for p in (mp.map, lambda f, xs, c: list(fp.map(f, xs, chunksize=c))):
                    p(process_batch, batches[: 2 * workers], 1)  # every worker warm, numpy loaded
                hops = small_tasks(say, check, fp, mp, summary)
                say()
                array_job(say, check, fp, mp, workers, summary)
                say()
                compute_bound(say, check, fp, mp, batches, reference, serial_s, hops, summary)
                say()
        finally:
            mp.terminate()
            mp.join()
        last = supervision(say, check, workers, batches, reference, summary)
        mp_crash(say, workers, summary)
        say()
        say("5. Cleanup")
        check(
            bool(last),
            "the board and the arena are anonymous memfds: the workers map nothing from /dev/shm",
        )
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(alive(p) for p in last):
            time.sleep(0.02)
        left = [p for p in last if alive(p)]
        check(
            not left,
            "after shutdown no worker is left running",
            f"still running: {left}" if left else "",
        )
    finally:
        logging.getLogger("fastpool").removeHandler(quiet)
        logging.getLogger("fastpool").propagate = True
    say()
    regime, lines = regime_report(load_start, machine_load())
    say(
        "Summary: fastpool.Pool against multiprocessing.Pool, "
        f"{workers} workers each, measured above on a {regime} machine"
    )
    for line in summary + lines:
        say(f"   {line}")
    failed = check.failed
    total = time.perf_counter() - t_start
    if failed:
        say(
            f"\ndemo FAILED {len(failed)} of {len(check.results)} checks in {total:.1f} s: "
            + "; ".join(failed)
        )
        return 1
    say(f"\ndemo passed all {len(check.results)} checks in {total:.1f} s")
    return 0
