"""Start-up: how long before a new pool gives its first answer, and how long a
killed worker takes to be replaced.

* Construction to first result: ``Pool(...)`` then ``submit(import_numpy).result()``,
  each peer with its default start method (in ``extra_info``). A forking peer whose
  parent already imported numpy pays nothing for the import; a spawning one pays it
  in the worker. That is what users get, so it is what is timed. The timed rounds
  run in this (long-lived) process; ``fresh_ms`` is the median of FRESH_RUNS first
  pools, each in a new interpreter that imported numpy, so it includes what a pool
  starts once per process (fastpool's template, loky's resource tracker).
* Replacement worker (fastpool only): SIGKILL the idle worker of a 1-worker pool,
  then time until a task runs in a new worker. The peers have no equivalent:
  ProcessPoolExecutor and loky turn broken for good, and mp.Pool usually deadlocks
  when a worker dies idle, because it dies holding the task queue's read lock.
"""

from __future__ import annotations

import os
import signal
import time

import numpy  # noqa: F401  (see the module docstring: the parent has numpy, as users' do)
import pytest

import _tasks
from _peers import (
    PEERS,
    TASK_PEERS,
    Peer,
    close_peer,
    fresh_process_first_result_s,
    open_peer,
    tag,
    worker_processes,
)

START_WORKERS = 2
FRESH_RUNS = 3
REPLACE_TIMEOUT_S = 10.0


@pytest.mark.parametrize("name", TASK_PEERS)
def test_start_to_first_result(benchmark, name):
    benchmark.group = f"start: construct to first result (import numpy), {START_WORKERS} workers"
    cls = PEERS[name]
    cls.require()
    opened: list[tuple[Peer, set[int]]] = []
    before: set[int] = set()

    def close_previous():
        # Neither shutting down nor listing processes is start-up: the previous
        # round's pool is closed in the next round's (untimed) setup, the last one
        # after the loop.
        nonlocal before
        while opened:
            close_peer(*opened.pop())
        before = {p.pid for p in worker_processes()}

    def start():
        peer = cls(START_WORKERS)
        opened.append((peer, before))
        return peer, peer.submit(_tasks.import_numpy).result(timeout=60)

    try:
        peer, version = benchmark.pedantic(start, setup=close_previous, rounds=5, iterations=1)
        start_method = peer.start_method
    finally:
        close_previous()
    assert version
    fresh = sorted(fresh_process_first_result_s(name, START_WORKERS) for _ in range(FRESH_RUNS))
    tag(benchmark, name, start_method=start_method, fresh_ms=round(fresh[len(fresh) // 2] * 1e3, 1))


def _worker_pids(pool) -> list[int] | None:
    """Worker pids from ``pool.stats()``, dict- or attribute-style; None if it has none."""
    stats_fn = getattr(pool, "stats", None)
    if stats_fn is None:
        return None
    stats = stats_fn()
    workers = stats.get("workers") if isinstance(stats, dict) else getattr(stats, "workers", None)
    if not workers:
        return None
    pids = []
    for w in workers:
        pid = w.get("pid") if isinstance(w, dict) else getattr(w, "pid", None)
        if pid:
            pids.append(pid)
    return pids or None


def test_replacement_worker(benchmark):
    benchmark.group = "start: SIGKILL an idle worker, time until a task runs again"
    with open_peer("fastpool", workers=1) as peer:
        if _worker_pids(peer.pool) is None:
            pytest.skip("fastpool.Pool.stats() does not list worker pids")
        victim = {}

        def kill_idle_worker():
            # the worker that just answered is idle now: its pid, cross-checked with stats()
            pid = peer.submit(_tasks.getpid).result(timeout=REPLACE_TIMEOUT_S)
            assert pid in _worker_pids(peer.pool)
            os.kill(pid, signal.SIGKILL)
            victim["pid"] = pid

        def until_a_task_runs():
            # A task submitted while the pool notices the death may fail with
            # WorkerCrashed/BrokenPool rather than wait: retry until one runs.
            deadline = time.monotonic() + REPLACE_TIMEOUT_S
            while time.monotonic() < deadline:
                try:
                    pid = peer.submit(_tasks.getpid).result(timeout=max(0.01, deadline - time.monotonic()))
                except Exception:
                    continue
                if pid != victim["pid"]:
                    return pid
            raise TimeoutError(
                f"no task ran within {REPLACE_TIMEOUT_S} s of SIGKILL to idle worker {victim['pid']}; "
                f"workers: {peer.pool.stats()['workers']}"
            )

        benchmark.pedantic(until_a_task_runs, setup=kill_idle_worker, rounds=5, iterations=1)
        tag(benchmark, "fastpool", start_method=peer.start_method)
