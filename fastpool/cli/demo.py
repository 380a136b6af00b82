"""``python -m fastpool demo``: a NumPy batch job on fastpool and on multiprocessing.Pool,
then fastpool's supervision, live.

    make_batches()          built-in data: float64 batches, sinusoids in noise, fixed seed
    in-process reference    process_batch over every batch, serially, in this process
    throughput              the same map on multiprocessing.Pool and fastpool.Pool, rounds
                            interleaved, best round of each; results compared bit for bit
    supervision             tasks that SIGKILL and segfault their own worker beside normal
                            ones; a spinning task under pool.options(timeout=0.5)

Every function a worker runs (``process_batch``, ``die_by_sigkill``, ``die_by_segfault``,
``spin``) lives at module level here, so the workers of both pools unpickle it by name,
whatever their start method.  ``run_demo`` returns the exit code: 0 when every check
passed, 1 otherwise.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TextIO

import numpy as np

# One BLAS thread per process for both pools and the in-process reference: the
# throughput comparison then measures the pools, not two BLAS configurations,
# and every process computes the same bits.  __main__ sets these before numpy
# is imported; they are listed here so the demo can say what it ran with.
BLAS_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

SEED = 2024
ROWS = 384
COLS = 512
TOP_EIGENVALUES = 4
HEAL_WAIT_S = 15.0
RESULT_WAIT_S = 60.0
TASK_TIMEOUT_S = 0.5
SPIN_LIMIT_S = 30.0  # spin() gives up by itself, so a broken timeout cannot strand a worker


# ---- worker side -------------------------------------------------------------------


def process_batch(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row statistics, the dominant frequency of each row, and the batch's Gram spectrum.

    Returns ``(features, top)``: ``features`` is ``(rows, 7)`` float64 (mean, std, min,
    max, peak frequency bin, spectral power, Gram row sum), ``top`` the largest
    ``TOP_EIGENVALUES`` eigenvalues of ``x @ x.T / cols``.  About 8 ms for a 384 x 512
    batch on one core of the project's machine."""
    spectrum = np.abs(np.fft.rfft(x, axis=1))
    peak = spectrum[:, 1:].argmax(axis=1) + 1  # bin 0 is the mean, not a frequency
    power = (spectrum**2).sum(axis=1)
    gram = x @ x.T / x.shape[1]
    top = np.linalg.eigvalsh(gram)[-TOP_EIGENVALUES:]
    features = np.column_stack(
        [x.mean(axis=1), x.std(axis=1), x.min(axis=1), x.max(axis=1), peak, power, gram.sum(axis=1)]
    )
    return features, top


def die_by_sigkill() -> None:
    """Kills its own worker with SIGKILL, as the kernel's OOM killer would."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_by_segfault() -> None:
    """Dereferences NULL in C: the worker dies of SIGSEGV, as with a bug in native code."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the user's directory
    except (ImportError, ValueError, OSError):
        pass
    ctypes.string_at(0)


def spin(seconds: float = SPIN_LIMIT_S) -> str:
    """Burns CPU for ``seconds`` in pure Python (never sleeps), then returns."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return f"spun {n} times"


# ---- parent side -------------------------------------------------------------------


def make_batches(n_batches: int, rows: int = ROWS, cols: int = COLS, seed: int = SEED) -> list[np.ndarray]:
    """``n_batches`` arrays of ``(rows, cols)`` float64: one sinusoid per row in unit noise.

    Row i of batch b has its own frequency (a whole number of cycles per row), so
    ``process_batch`` has a right answer to find.  Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    n_freqs = cols // 4
    phase = 2 * np.pi * np.arange(cols) / cols
    table = 2.0 * np.sin(np.arange(1, n_freqs + 1)[:, None] * phase)  # (n_freqs, cols)
    out = []
    for _ in range(n_batches):
        freqs = rng.integers(1, n_freqs + 1, size=rows)
        batch = rng.standard_normal((rows, cols))
        batch += table[freqs - 1]
        out.append(batch)
    return out


def same_results(a: list, b: list) -> bool:
    """Bit for bit: every array of every result equal, NaN nowhere."""
    if len(a) != len(b):
        return False
    return all(
        len(ra) == len(rb) and all(np.array_equal(xa, xb) for xa, xb in zip(ra, rb)) for ra, rb in zip(a, b)
    )


class _Checks:
    """Named pass/fail checks; the demo's exit code is whether all passed."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.results: list[tuple[str, bool]] = []

    def __call__(self, ok: bool, what: str, detail: str = "") -> bool:
        self.results.append((what, bool(ok)))
        mark = "ok  " if ok else "FAIL"
        self.out.write(f"   [{mark}] {what}{(': ' + detail) if detail else ''}\n")
        self.out.flush()
        return bool(ok)

    @property
    def failed(self) -> list[str]:
        return [what for what, ok in self.results if not ok]


def _timed(run: Callable[[], list]) -> tuple[float, list]:
    t0 = time.perf_counter()
    results = run()
    return time.perf_counter() - t0, results


def _outcome(fut: Future) -> tuple[str, BaseException | None]:
    try:
        fut.result(timeout=RESULT_WAIT_S)
    except BaseException as exc:  # noqa: BLE001 - the demo shows whatever each future got
        return "error", exc
    return "ok", None


def _wait_healed(pool: Any, restarts: int, workers: int) -> bool:
    """True once ``restarts`` replacements happened and every slot holds a ready worker."""
    deadline = time.monotonic() + HEAL_WAIT_S
    while time.monotonic() < deadline:
        stats = pool.stats()
        ready = sum(1 for w in stats["workers"] if w["state"] == "ready")
        if stats["restarts"] >= restarts and ready == workers:
            return True
        time.sleep(0.02)
    return False


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _shared_mappings(pids: list[int]) -> tuple[set[str], int]:
    """(files under /dev/shm that any of ``pids`` maps, how many of ``pids`` map the board's memfd)."""
    shm: set[str] = set()
    with_memfd = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        paths = {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}
        shm |= {p for p in paths if p.startswith("/dev/shm/")}
        with_memfd += any(p.startswith("/memfd:fastpool") for p in paths)
    return shm, with_memfd


def run_demo(
    workers: int | None = None, n_batches: int = 64, rounds: int = 3, out: TextIO = sys.stdout
) -> int:
    """Runs the whole demo, writing to ``out``.  Returns 0 if every check passed, else 1."""
    import fastpool
    from fastpool import TaskTimeout, WorkerCrashed, _sizing

    t_start = time.perf_counter()
    say = lambda text="": (out.write(text + "\n"), out.flush())  # noqa: E731
    check = _Checks(out)
    # The pool logs each crash at ERROR; the demo prints the same records itself.
    quiet = logging.NullHandler()
    logging.getLogger("fastpool").addHandler(quiet)
    if workers is None:
        workers = _sizing.default_workers()
    try:
        blas = ", ".join(f"{v}={os.environ.get(v, 'unset')}" for v in BLAS_ENV_VARS)
        say(f"fastpool {fastpool.__version__} demo: {workers} workers "
            f"(this process may use {_sizing.usable_cpus()} CPUs); {blas}")

        t0 = time.perf_counter()
        batches = make_batches(n_batches)
        mib = sum(b.nbytes for b in batches) / 2**20
        say(f"data: {n_batches} batches of {ROWS} x {COLS} float64 "
            f"({batches[0].nbytes / 2**20:.1f} MiB each, {mib:.0f} MiB in all), "
            f"made in {time.perf_counter() - t0:.2f} s")
        say("job:  per batch, row mean/std/min/max, each row's dominant frequency (rFFT), and the "
            f"top {TOP_EIGENVALUES} eigenvalues of its {ROWS} x {ROWS} Gram matrix")

        process_batch(batches[0])  # first call pays FFT and LAPACK set-up
        serial_s, reference = _timed(lambda: [process_batch(b) for b in batches])
        say(f"      in this process, one core: {serial_s:.2f} s, {serial_s / n_batches * 1e3:.1f} ms a batch")
        say()

        # ---- 1. throughput ----------------------------------------------------------
        say(f"1. Throughput: map(process_batch, {n_batches} batches, chunksize=1), {workers} workers each, "
            f"best of {rounds} rounds, rounds interleaved")
        # multiprocessing.Pool first: its workers are forked now, while this process
        # has no threads yet (fastpool's pool starts a supervisor and a collector).
        mp_pool = multiprocessing.Pool(workers)
        try:
            # blas_threads=1: like multiprocessing.Pool's workers, whatever threadpoolctl could do
            with fastpool.Pool(workers, blas_threads=1) as pool:
                for p in (mp_pool, pool):  # warm: every worker imported numpy and ran once
                    list(p.map(process_batch, batches[: 2 * workers], chunksize=1))
                mp_best = fp_best = float("inf")
                mp_results: list = []
                fp_results: list = []
                for _ in range(rounds):
                    s, mp_results = _timed(lambda: mp_pool.map(process_batch, batches, chunksize=1))
                    mp_best = min(mp_best, s)
                    s, fp_results = _timed(lambda: list(pool.map(process_batch, batches, chunksize=1)))
                    fp_best = min(fp_best, s)
        finally:
            mp_pool.terminate()
            mp_pool.join()
        for name, secs in (("multiprocessing.Pool", mp_best), ("fastpool.Pool", fp_best)):
            say(f"   {name:<22}{secs:7.3f} s  {n_batches / secs:7.1f} batches/s  {mib / secs:7.1f} MiB/s")
        say(f"   in-process (1 core)   {serial_s:7.3f} s  {n_batches / serial_s:7.1f} batches/s")
        say(f"   fastpool / multiprocessing.Pool throughput: {mp_best / fp_best:.2f}x")
        check(same_results(fp_results, mp_results) and same_results(fp_results, reference),
              "results identical", f"fastpool == multiprocessing.Pool == in-process, bit for bit, "
              f"{n_batches} batches")
        say()

        # ---- 2. crashes --------------------------------------------------------------
        say("2. Supervision: two tasks kill their own worker (SIGKILL, segfault) among 6 normal ones")
        with fastpool.Pool(workers, blas_threads=1) as pool:
            pool.submit(int).result(timeout=RESULT_WAIT_S)
            _wait_healed(pool, 0, workers)  # every worker started, so "before" lists them all
            pids_before = sorted(pool.pids())
            order: list[int | Callable[[], None]] = [0, die_by_sigkill, 1, die_by_segfault, 2, 3, 4, 5]
            futures: list[tuple[str, int | None, Future]] = []
            for item in order:
                if isinstance(item, int):
                    futures.append((f"process_batch(batches[{item}])", item,
                                    pool.submit(process_batch, batches[item])))
                else:
                    futures.append((f"{item.__name__}()", None, pool.submit(item)))
            outcomes = {label: _outcome(fut) for label, _, fut in futures}
            for label, (status, exc) in outcomes.items():
                if status == "ok":
                    say(f"   {label:<27} -> completed")
                else:
                    say(f"   {label:<27} -> {type(exc).__name__}: {exc}")
            for label, sig in (("die_by_sigkill()", "SIGKILL"), ("die_by_segfault()", "SIGSEGV")):
                exc = outcomes[label][1]
                check(isinstance(exc, WorkerCrashed) and exc.signal_name == sig and sig in str(exc),
                      f"{label} failed with WorkerCrashed naming {sig}",
                      f"got {type(exc).__name__}" if not isinstance(exc, WorkerCrashed) else "")
            good = [(i, fut) for _, i, fut in futures if i is not None]
            got = [fut.result(timeout=0) for _, fut in good if fut.exception(timeout=0) is None]
            check(len(got) == len(good) and same_results(got, [reference[i] for i, _ in good]),
                  "the other 6 futures completed with the right results")
            healed = _wait_healed(pool, 2, workers)
            stats = pool.stats()
            for rec in stats["crashes"]:
                say(f"   crash record: slot {rec['slot']} pid {rec['pid']} {rec['cause']} "
                    f"{rec['signal'] or rec['exitcode']} running task {rec['task_id']} {rec['function']}"
                    f"({rec['args']}), worker age {rec['worker_age_s']:.2f} s, served {rec['tasks_served']}")
            pids_after = sorted(pool.pids())
            say(f"   workers before: {pids_before}, after: {pids_after}; "
                f"restarts {stats['restarts']}, crashed {stats['crashed']}")
            check(healed and len(stats["crashes"]) == 2 and len(pids_after) == workers,
                  f"both dead workers replaced, {workers} ready again",
                  f"restarts {stats['restarts']}, states {[w['state'] for w in stats['workers']]}")
            say()

            # ---- 3. timeout ----------------------------------------------------------
            say(f"3. Per-task timeout: pool.options(timeout={TASK_TIMEOUT_S}).submit(spin)  "
                f"(spin would burn CPU for {SPIN_LIMIT_S:g} s)")
            t0 = time.monotonic()
            status, exc = _outcome(pool.options(timeout=TASK_TIMEOUT_S).submit(spin, SPIN_LIMIT_S))
            took = time.monotonic() - t0
            say(f"   spin() -> {type(exc).__name__ if exc else 'completed'}: {exc} (after {took:.2f} s)")
            check(isinstance(exc, TaskTimeout) and isinstance(exc, TimeoutError) and took < 5.0,
                  "spin() failed with TaskTimeout (a TimeoutError) within 5 s")
            healed = _wait_healed(pool, 3, workers)
            after = pool.submit(process_batch, batches[7]).result(timeout=RESULT_WAIT_S)
            check(healed and same_results([after], [reference[7]]),
                  "the timed-out worker was replaced and the pool still computes correctly")
            stats = pool.stats()
            say("   pool.stats(): " + ", ".join(
                f"{k} {stats[k]}" for k in ("submitted", "completed", "failed", "crashed", "restarts")))
            say()

            # ---- 4. cleanup ----------------------------------------------------------
            say("4. Cleanup")
            last_pids = sorted(pool.pids())
            # The workers, not this process: multiprocessing.Pool's semaphores stay
            # mapped here as deleted /dev/shm files.
            shm, with_memfd = _shared_mappings(last_pids)
            _, parent_memfd = _shared_mappings([os.getpid()])
            check(not shm and with_memfd == len(last_pids) and parent_memfd == 1,
                  "the board is an anonymous memfd (memfd:fastpool), mapped by this process and "
                  "every worker; the workers map nothing from /dev/shm",
                  f"/dev/shm files the workers map: {sorted(shm)}" if shm else "")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_alive(p) for p in last_pids):
            time.sleep(0.02)
        left = [p for p in last_pids if _alive(p)]
        check(not left, "after shutdown no worker is left running", f"still running: {left}" if left else "")
    finally:
        logging.getLogger("fastpool").removeHandler(quiet)

    say()
    failed = check.failed
    total = time.perf_counter() - t_start
    if failed:
        say(f"demo FAILED {len(failed)} of {len(check.results)} checks in {total:.1f} s: "
            + "; ".join(failed))
        return 1
    say(f"demo passed all {len(check.results)} checks in {total:.1f} s")
    return 0


def add_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes for both pools (default: the CPUs this process may use)")
    p.add_argument("--batches", type=int, default=64, help="number of batches (default: 64)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timed rounds per pool; the best one counts (default: 3)")


def run(args, parser) -> int:
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    return run_demo(args.workers, args.batches, args.rounds)
