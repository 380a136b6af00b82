"""The load the contention rows make, and what they read off it (``bench --section contention``).

    hogs(n)                 context manager: n CPU hogs (``while True: pass`` in a new
                            interpreter each, at the bench's own nice value), running before
                            it yields, each ended by its pid (SIGKILL, then reaped) on exit
    programs_at_once(...)   n programs, each a new interpreter with its own pool, timing no-op
                            round trips over the same seconds: every program's median
    idle_cpu(...)           CPU seconds per second of this process and every process under it
                            (its pool's workers), over a window after a settle
    batch_memory(...)       a batch of array slices by value through a pool's map into an
                            output array: the PSS it added at its peak and still holds after

Everything here starts processes only through the functions above, and ends every one of them
itself, by pid, whatever happens in between: a contention row never leaves a hog running.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psutil

from fastpool._bench import peers as _peers
from fastpool._bench import tasks

READY_TIMEOUT_S = 60.0  # a program's interpreter, imports and warm pool, on a loaded machine
_HOG = "import sys\nsys.stdout.write('running\\n')\nsys.stdout.flush()\nwhile True:\n    pass\n"


def _end(procs: list[subprocess.Popen], theirs: Sequence[psutil.Process] = ()) -> None:
    """SIGKILL each of ``procs`` by its pid and reap it (a hog never exits by itself), then
    wait for ``theirs``, the processes they started (peers.reap: SIGKILL and a warning for
    any still running after REAP_TIMEOUT_S)."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
    # A program's pool leaves servers that end by themselves when it exits (3.14's default
    # forkserver and resource tracker: on EOF of their pipe), moments after it.  Without
    # this wait, a row returned with them still running, orphaned.
    if theirs:
        _peers.reap(list(theirs), "a program's pool")


def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return []


@contextlib.contextmanager
def hogs(n: int) -> Iterator[list[int]]:
    """``n`` CPU hogs, each already spinning when this yields their pids; all ended on exit.

    A hog is a new interpreter (inheriting this process's nice value and CPU affinity) that
    writes one line and then spins: the line is the event waited for, so the rows that follow
    run against hogs that are on the CPUs, not still starting."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _HOG],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for proc in procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if line.strip() != "running":
                raise RuntimeError(f"CPU hog {proc.pid} did not start (exit {proc.poll()})")
        yield [p.pid for p in procs]
    finally:
        _end(procs)


def programs_at_once(peer: str, n: int, workers: int, seconds: float) -> list[float]:
    """``n`` programs at once, each a new interpreter with its own ``peer`` pool of
    ``workers``: each times no-op round trips for the same ``seconds``, started together
    once every one is warm. Returns each program's median round trip, in seconds."""
    procs: list[subprocess.Popen] = []
    theirs: list[psutil.Process] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "fastpool._bench.load",
                        peer,
                        str(workers),
                        str(seconds),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for proc in procs:  # every pool warm before any clock starts
            if _read_line(proc, READY_TIMEOUT_S) != "ready":
                raise RuntimeError(f"program {proc.pid} did not get ready: {_stderr(proc)}")
            theirs += _descendants(proc)  # its pool is up: the processes it runs exist now
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        medians = []
        for proc in procs:
            line = _read_line(proc, READY_TIMEOUT_S + seconds)
            try:
                medians.append(float(json.loads(line)["median_s"]))
            except (ValueError, KeyError, TypeError):
                raise RuntimeError(f"program {proc.pid} gave {line!r}: {_stderr(proc)}") from None
        for proc in procs:
            proc.wait(timeout=READY_TIMEOUT_S)
        return medians
    finally:
        _end(procs, theirs)


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return proc.stdout.readline().strip()


def _stderr(proc: subprocess.Popen) -> str:
    if proc.poll() is None or proc.stderr is None:
        return "(still running)"
    return proc.stderr.read()[-2000:]


def _program(peer: str, workers: int, seconds: float) -> None:
    """One of programs_at_once's programs: ``python -m fastpool._bench.load PEER W SECONDS``."""
    with _peers.open_peer(peer, workers) as p:
        for _ in range(200):
            p.submit(tasks.noop).result()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        lat = []
        end = time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            p.submit(tasks.noop).result()
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            if t1 >= end:
                break
        print(json.dumps({"median_s": statistics.median(lat), "calls": len(lat)}), flush=True)


def _cpu_s(proc: psutil.Process) -> float | None:
    """CPU seconds of ``proc``'s live threads, from the scheduler's nanosecond counters
    (/proc/PID/task/*/schedstat): cpu_times() counts clock ticks, 10 ms each, which
    reads an idle peer's 1-2 ms/s as 0 and fastpool's as multiples of 5 ms/s over a 2 s
    window. Falls back to cpu_times() where the kernel keeps no schedstat. None when the
    process has ended."""
    if _HAS_SCHEDSTAT:
        task = f"/proc/{proc.pid}/task"
        try:
            tids = os.listdir(task)
        except FileNotFoundError:
            return None
        total_ns = 0
        for tid in tids:
            try:
                with open(f"{task}/{tid}/schedstat", "rb") as f:
                    total_ns += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended between the listing and the read
        return total_ns / 1e9
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


_HAS_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def idle_cpu(settle_s: float, window_s: float) -> dict[str, float]:
    """CPU seconds per second of this process (``parent``) and every process under it
    (``workers``: the pool's workers and whatever else it runs), over ``window_s`` after
    ``settle_s``, with nothing submitted. A process that starts or ends in the window is
    left out (its CPU cannot be split at the window's edges)."""
    time.sleep(settle_s)
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    before = {p.pid: _cpu_s(p) for p in procs}
    t0 = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - t0
    used = {p.pid: _cpu_s(p) for p in procs}
    spent = {
        pid: used[pid] - start  # type: ignore[operator]
        for pid, start in before.items()
        if start is not None and used.get(pid) is not None
    }
    parent = spent.get(me.pid, 0.0) / elapsed
    workers = sum(v for pid, v in spent.items() if pid != me.pid) / elapsed
    return {"total": parent + workers, "parent": parent, "workers": workers}


def batch_memory(
    peer: _peers.Peer, arr: Any, out: Any, slices: int, settle_s: float
) -> dict[str, Any]:
    """``slices`` slices of ``arr`` by value through ``peer``'s map (chunksize=1, its own
    iteration: fastpool's and the executors' lazy, multiprocessing.Pool's a list) into
    ``out``, already faulted. PSS of this process and its workers (memory.MemorySampler):
    ``peak_mib`` added at the peak, ``held_mib`` still added ``settle_s`` after the map."""
    import numpy as np

    from fastpool._bench.memory import MemorySampler

    n = arr.shape[0]
    bounds = [(i * n // slices, (i + 1) * n // slices) for i in range(slices)]
    with MemorySampler(interval_s=0.01) as sampler:
        parts = peer.map_iter(tasks.soft_threshold, [arr[lo:hi] for lo, hi in bounds], 1)
        for (lo, hi), part in zip(bounds, parts, strict=True):
            out[lo:hi] = part
        del parts, part
    gc.collect()
    time.sleep(settle_s)  # what the pool keeps, not what it is still handing back
    held = sampler.sample()[1]
    lo, hi = bounds[-1]
    # float32 statistics may round differently on another alignment: close, not equal
    if not np.allclose(out[lo:hi], tasks.soft_threshold(arr[lo:hi]), rtol=1e-4, atol=1e-5):
        raise AssertionError("the batch's last slice came back wrong")
    mib = 2**20
    return {
        "peak_mib": (sampler.peak_pss - sampler.baseline_pss) / mib,
        "held_mib": (held - sampler.baseline_pss) / mib,
    }


def held_stats(peer: _peers.Peer) -> dict[str, Any]:
    """fastpool's own account of the memory it holds (stats() fields about held or reserved
    memory, where this version has them); {} for the other peers."""
    pool = getattr(peer, "pool", None)
    stats = getattr(pool, "stats", None)
    if peer.name != "fastpool" or stats is None:
        return {}
    with contextlib.suppress(Exception):
        return _held_fields(stats())
    return {}


def _held_fields(stats: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(_held_fields(value, name + "."))
        elif isinstance(value, (int, float)) and any(
            word in name for word in ("held", "reserve", "arena", "returned")
        ):
            found[name] = value
    return found


if __name__ == "__main__":
    _program(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
