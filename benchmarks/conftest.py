"""Benchmark fixtures: each peer constructed, warmed outside the timing, always shut down.

Run from the repository root (the repo's testpaths only name tests/):

    python -m pytest benchmarks -p no:cacheprovider --benchmark-only --benchmark-json=bench.json
    python benchmarks/report.py bench.json

Every test runs each peer in the same session and puts them in one pytest-benchmark
group, so report.py can print ratios (peer time / fastpool time). Nothing asserts a
time: absolute numbers depend on the machine, ratios much less. The PEERS table, the
adapters and the scenarios' calls live in the package (fastpool/_bench/), shared with
``python -m fastpool bench``; _peers.py re-exports them, turning a peer that is not
installed into a skip (test modules import from it; importing conftest.py from a test
module is not reliable); this file turns them into fixtures:

    peer           warmed adapter for each of TASK_PEERS (fastpool, mp.Pool, PPE, loky)
    array_peer     the same plus joblib (memmapping), for the array benchmarks
    fastpool_peer  fastpool alone, for its shared-array idioms
    workers        2; a test overrides it with @pytest.mark.parametrize("workers", ...)

Whatever the test did, the fixture shuts the executor down and kills (with a warning)
any worker it left behind.
"""

from __future__ import annotations

import os
import sys

import pytest

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
# The repo's pytest config only puts tests/ on sys.path; the test modules import
# _peers and _tasks from here. Workers need no path: the functions they run live in
# the installed package (fastpool/_bench/tasks.py).
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

import _peers  # noqa: E402
import _tasks  # noqa: E402
from _peers import ARRAY_PEERS, DEFAULT_WORKERS, PEERS, TASK_PEERS, open_peer, worker_processes  # noqa: E402,F401

if os.path.dirname(os.path.abspath(_tasks.__file__)) != BENCH_DIR:
    # tests/_tasks.py has the same module name and got imported first (tests and
    # benchmarks collected in one run): workers would get the wrong functions.
    raise pytest.UsageError(
        f"_tasks was imported from {_tasks.__file__}, not {BENCH_DIR}: "
        "run the benchmarks in a pytest run of their own (python -m pytest benchmarks ...)"
    )


@pytest.fixture
def workers() -> int:
    """Worker count; a test overrides it with @pytest.mark.parametrize("workers", ...)."""
    return DEFAULT_WORKERS


@pytest.fixture(params=TASK_PEERS)
def peer(request, workers):
    with open_peer(request.param, workers) as p:
        yield p


@pytest.fixture(params=ARRAY_PEERS)
def array_peer(request, workers):
    with open_peer(request.param, workers) as p:
        yield p


@pytest.fixture
def fastpool_peer(workers):
    with open_peer("fastpool", workers) as p:
        yield p


def pytest_sessionfinish(session, exitstatus):
    """Say so if any worker outlived its test (open_peer should have reaped it)."""
    session.config._bench_exitstatus = int(exitstatus)
    leftovers = [p.pid for p in worker_processes() if p.is_running()]
    if leftovers:
        print(f"\nbenchmarks: child processes still running at exit: {leftovers}", file=sys.stderr)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # A pool whose shutdown() never returned (see close_peer) leaves threads that the
    # interpreter would join at exit, forever. The JSON and the summary are written
    # by now: leave without running atexit handlers, with pytest's exit status.
    if _peers.ABANDONED:
        print(
            f"benchmarks: shutdown hung for {_peers.ABANDONED}; exiting with os._exit",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(getattr(config, "_bench_exitstatus", 1) or 1)
