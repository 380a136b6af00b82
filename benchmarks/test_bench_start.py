"""Start-up: how long before a new pool gives its first answer, and how long a
killed worker takes to be replaced.

* Construction to first result: ``Pool(...)`` then ``submit(import_numpy).result()``,
  each peer with its default start method (in ``extra_info``). A forking peer whose
  parent already imported numpy pays nothing for the import; a spawning one pays it
  in the worker. That is what users get, so it is what is timed. The timed rounds
  run in this (long-lived) process; ``fresh_ms`` is the median of FRESH_RUNS first
  pools, each in a new interpreter that imported numpy, so it includes what a pool
  starts once per process (fastpool's template, loky's resource tracker).
* Fresh processes (issue 8, section 4): every sample is a new interpreter running a
  small script (a file, so ``__main__`` has one, as users run it) that imports numpy
  first, then times, inside itself, ``import <peer>`` or constructor to the first result
  of a task that uses numpy. The import rows add ``import concurrent.futures`` (what
  any executor pays) and ``from fastpool import Pool`` (``fastpool [Pool]``): pool.py
  and the parent's machinery load at the first ``fastpool.Pool``, so that row is what
  ``import fastpool`` leaves to the first pool, and the first-result rows, which name
  ``fastpool.Pool`` inside the timing, include it. Beside the pools: a plain
  ``multiprocessing`` spawn of a child that imports numpy, and the first forkserver
  start with numpy preloaded.
  ``fastpool [spawned template]`` forces the template to be spawned
  (``FASTPOOL_TEMPLATE_START=spawn``, what a parent with other threads or over 256 MiB
  gets); ``fastpool [script]`` submits a function defined in the script. The cases run
  interleaved, FRESH_ROUNDS rounds of each, so machine noise lands on all of them alike;
  each test then reports its samples through a clock that advances only by what its
  child measured (``CHILD_CLOCK``), so the table holds the children's times, not the
  cost of starting the children.
* Replacement worker (fastpool only): SIGKILL the idle worker of a 1-worker pool,
  then time until a task runs in a new worker. The peers have no equivalent:
  ProcessPoolExecutor and loky turn broken for good, and mp.Pool usually deadlocks
  when a worker dies idle, because it dies holding the task queue's read lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import _tasks
import numpy  # noqa: F401  (see the module docstring: the parent has numpy, as users' do)
import pytest
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
FRESH_ROUNDS = 7
REPLACE_TIMEOUT_S = 10.0
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


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
                    pid = peer.submit(_tasks.getpid).result(
                        timeout=max(0.01, deadline - time.monotonic())
                    )
                except Exception:
                    continue
                if pid != victim["pid"]:
                    return pid
            raise TimeoutError(
                f"no task ran within {REPLACE_TIMEOUT_S} s of SIGKILL to idle worker "
                f"{victim['pid']}; "
                f"workers: {peer.pool.stats()['workers']}"
            )

        benchmark.pedantic(until_a_task_runs, setup=kill_idle_worker, rounds=5, iterations=1)
        tag(benchmark, "fastpool", start_method=peer.start_method)


# --- fresh processes ------------------------------------------------------------------


class _ChildClock:
    """A pytest-benchmark timer that moves only when a sample is added to it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CHILD_CLOCK = _ChildClock()

_PRE = """
import numpy, time, sys, os
_KIND = dict(_ForkedProcess="template-fork", Popen="template-spawn")
"""
_FIRST = (
    _PRE
    + """
import {module}
t0 = time.perf_counter()
{make}
result = {submit}
elapsed = time.perf_counter() - t0
assert result
print({start}, elapsed)
{close}
"""
)
_IMPORTS = {  # (peer, idiom): the statement timed
    ("fastpool", ""): "import fastpool",
    # what naming the pool costs: pool.py and the parent's machinery load at the first
    # `fastpool.Pool`, so this is `import fastpool` plus what a first Pool() will pay
    ("fastpool", "Pool"): "from fastpool import Pool",
    ("mp.Pool", ""): "import multiprocessing",
    ("concurrent.futures", ""): "import concurrent.futures",
    ("PPE", ""): "from concurrent.futures import ProcessPoolExecutor",
    ("loky", ""): "import loky",
}
_POOLS = {  # peer: (module, constructor, first result, how it starts workers, close)
    "fastpool": (
        "fastpool, _tasks",
        "p = fastpool.Pool({n})",
        "p.submit(_tasks.import_numpy).result()",
        "_KIND[type(sys.modules['fastpool._runtime._template'].template()._proc).__name__]",
        "p.shutdown()",
    ),
    "mp.Pool": (
        "multiprocessing, _tasks",
        "p = multiprocessing.Pool({n})",
        "p.apply_async(_tasks.import_numpy).get()",
        "multiprocessing.get_start_method()",
        "p.terminate()",
    ),
    "PPE": (
        "concurrent.futures, _tasks",
        "p = concurrent.futures.ProcessPoolExecutor({n})",
        "p.submit(_tasks.import_numpy).result()",
        "p._mp_context.get_start_method()",
        "p.shutdown()",
    ),
    "loky": (
        "loky, _tasks",
        "p = loky.get_reusable_executor({n})",
        "p.submit(_tasks.import_numpy).result()",
        "'loky'",
        "p.shutdown()",
    ),
}
_CHILD = (
    _PRE
    + """
import multiprocessing, _tasks
if __name__ == "__main__":
    ctx = multiprocessing.get_context("{method}")
    {preload}
    t0 = time.perf_counter()
    child = ctx.Process(target=_tasks.import_numpy)
    child.start()
    child.join()
    elapsed = time.perf_counter() - t0
    assert child.exitcode == 0
    print("{method}", elapsed)
"""
)
_SCRIPT = (
    _PRE
    + """
import fastpool

def total(n):
    return float(numpy.ones(n).sum())

if __name__ == "__main__":
    t0 = time.perf_counter()
    with fastpool.Pool({n}) as p:
        result = p.submit(total, 10).result()
        elapsed = time.perf_counter() - t0
        from fastpool._runtime import _template

        kind = _KIND[type(_template.template()._proc).__name__]
    assert result == 10.0
    print(kind, elapsed)
"""
)


def _fresh_cases() -> dict[tuple[str, str, str], tuple[str, dict[str, str]]]:
    """(kind, peer, idiom) -> (script, extra environment)."""
    n = START_WORKERS
    cases: dict[tuple[str, str, str], tuple[str, dict[str, str]]] = {}
    for (peer, idiom), stmt in _IMPORTS.items():
        code = _PRE + f"t0 = time.perf_counter()\n{stmt}\nprint('-', time.perf_counter() - t0)\n"
        cases[("import", peer, idiom)] = (code, {})
    for peer, (module, make, submit, start, close) in _POOLS.items():
        code = _FIRST.format(
            module=module, make=make.format(n=n), submit=submit, start=start, close=close
        )
        code = "if __name__ == '__main__':\n" + textwrap.indent(code, "    ")
        cases[("first", peer, "")] = (code, {})
        if peer == "fastpool":
            cases[("first", peer, "spawned template")] = (
                code,
                {"FASTPOOL_TEMPLATE_START": "spawn"},
            )
    cases[("first", "fastpool", "script")] = (_SCRIPT.format(n=n), {})
    cases[("first", "mp spawn child", "")] = (_CHILD.format(method="spawn", preload=""), {})
    cases[("first", "forkserver child", "")] = (
        _CHILD.format(method="forkserver", preload="ctx.set_forkserver_preload(['numpy'])"),
        {},
    )
    return cases


def _run_fresh(code: str, env_extra: dict[str, str], workdir: str) -> tuple[str, float]:
    path = os.path.join(workdir, "start.py")
    with open(path, "w") as f:
        f.write(code)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as users run
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (BENCH_DIR, os.path.dirname(BENCH_DIR), env.get("PYTHONPATH")) if p
    )
    env.update(env_extra)
    done = subprocess.run(
        [sys.executable, path],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"fresh-process case failed:\n{code}\n{done.stderr[-2000:]}")
    how, seconds = done.stdout.split()[-2:]
    return how, float(seconds)


@pytest.fixture(scope="module")
def fresh_samples() -> dict[tuple[str, str, str], tuple[str, list[float]]]:
    """Every case FRESH_ROUNDS times, interleaved round by round."""
    cases = {k: v for k, v in _fresh_cases().items() if k[1] not in ("loky",) or _has("loky")}
    out: dict[tuple[str, str, str], tuple[str, list[float]]] = {k: ("", []) for k in cases}
    with tempfile.TemporaryDirectory() as workdir:
        for key, (code, env) in cases.items():  # one untimed round: .pyc files, page cache
            _run_fresh(code, env, workdir)
        for _ in range(FRESH_ROUNDS):
            for key, (code, env) in cases.items():
                how, seconds = _run_fresh(code, env, workdir)
                out[key] = (how, out[key][1] + [seconds])
    return out


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _report(benchmark, samples: list[float]) -> None:
    it = iter(samples)
    benchmark.pedantic(lambda: CHILD_CLOCK.advance(next(it)), rounds=len(samples), iterations=1)


@pytest.mark.benchmark(timer=CHILD_CLOCK)
@pytest.mark.parametrize(
    "peer, idiom", list(_IMPORTS), ids=[f"{p}-{i}" if i else p for p, i in _IMPORTS]
)
def test_fresh_import(benchmark, fresh_samples, peer, idiom):
    if ("import", peer, idiom) not in fresh_samples:
        pytest.skip(f"{peer} is not installed")
    benchmark.group = "start: import in a fresh process (numpy imported first)"
    _report(benchmark, fresh_samples[("import", peer, idiom)][1])
    tag(benchmark, peer, idiom=idiom)


_FIRST_CASES = [key for key in _fresh_cases() if key[0] == "first"]


@pytest.mark.benchmark(timer=CHILD_CLOCK)
@pytest.mark.parametrize(
    "case", _FIRST_CASES, ids=[f"{p}-{i}" if i else p for _, p, i in _FIRST_CASES]
)
def test_fresh_first_result(benchmark, fresh_samples, case):
    if case not in fresh_samples:
        pytest.skip(f"{case[1]} is not installed")
    benchmark.group = (
        f"start: fresh process, construct to first result (numpy first), {START_WORKERS} workers"
    )
    how, samples = fresh_samples[case]
    _report(benchmark, samples)
    tag(benchmark, case[1], idiom=case[2], start_method=how)
