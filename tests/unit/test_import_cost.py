"""Claims about what ``import fastpool`` and a first pool load (issue 8, section 4).

Claims about modules, not times: each check runs in a fresh interpreter (NumPy
imported first, as users run it) and reads ``sys.modules``, so it holds on a
loaded machine too. The times, as ratios to the stdlib's imports, are in
benchmarks/test_bench_start.py.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

# Each is paid only where it is used: psutil off Linux, cloudpickle when a function
# goes by value, threadpoolctl in a worker with spare cores, asyncio for a coroutine,
# concurrent.futures.process (multiprocessing) for the BrokenPool family, pool.py
# and what it brings at the first `fastpool.Pool`, the worker's loop in workers; the
# call, codec and template modules with the first pool or the first name of theirs.
NOT_AT_IMPORT = (
    "fastpool._runtime._call",
    "fastpool._runtime._codec",
    "fastpool._runtime._template",
    "psutil",
    "cloudpickle",
    "threadpoolctl",
    "asyncio",
    "multiprocessing",
    "multiprocessing.connection",
    "concurrent.futures.process",
    "subprocess",
    "fastpool.pool",
    "fastpool._supervision._supervisor",
    "fastpool._supervision._verdict",
    "fastpool._supervision._memory",
    "fastpool._supervision._sizing",
    "fastpool._supervision._deaths",
    "fastpool._supervision._watch",
    "fastpool._supervision._slot",
    "fastpool._runtime._worker",
    "fastpool._runtime._serve",
    "fastpool.cli",
    "fastpool.dask",
    "distributed",
)


def run_fresh(code: str, env: dict[str, str] | None = None) -> str:
    """``code`` in a new interpreter that has imported numpy; its stdout."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), full_env.get("PYTHONPATH")) if p
    )
    done = subprocess.run(
        [sys.executable, "-c", "import numpy\n" + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def loaded_after(code: str, names: tuple[str, ...], env: dict[str, str] | None = None) -> set[str]:
    """Which of ``names`` are in ``sys.modules`` after ``code`` ran in a fresh interpreter."""
    report = f"\nimport sys\nprint(' '.join(n for n in {names!r} if n in sys.modules))\n"
    code = textwrap.dedent(code) + report
    out = run_fresh(code, env)
    return set(out.split())


def test_import_fastpool_loads_none_of_what_it_defers() -> None:
    assert loaded_after("import fastpool", NOT_AT_IMPORT) == set()


def test_the_checks_here_do_see_a_loaded_module() -> None:
    # The claims above are absences; this shows the reader finds what is there.
    assert loaded_after(
        "import fastpool", ("fastpool", "fastpool._native._core", "fastpool.errors")
    ) == {"fastpool", "fastpool._native._core", "fastpool.errors"}


def test_naming_pool_loads_the_facade_and_not_the_machinery_or_the_extras() -> None:
    # the supervision stack comes with the first pool, after its template's fork began
    loaded = loaded_after("from fastpool import Pool", NOT_AT_IMPORT)
    assert "fastpool.pool" in loaded and "fastpool._supervision._supervisor" not in loaded
    assert loaded.isdisjoint(
        {
            "psutil",
            "cloudpickle",
            "threadpoolctl",
            "asyncio",
            "multiprocessing",
            "concurrent.futures.process",
            "fastpool._runtime._worker",
            "fastpool._runtime._serve",
        }
    )


def test_a_pool_constructors_imports_leave_out_deaths_memory_timing_and_progress() -> None:
    # Each comes at its first use (a death, the first memory tick, a task to time, a
    # map's progress), not on a first pool's way to its first result: ~3 ms of imports.
    code = """
        import fastpool
        fastpool.Pool
        import fastpool._supervision._lifetime  # what the constructor imports
    """
    names = (
        "fastpool._supervision._supervisor",
        "fastpool._supervision._verdict",
        "fastpool._supervision._memory",
        "fastpool._supervision._deaths",
        "fastpool._supervision._watch",
        "fastpool._integrations._progress",
    )
    assert loaded_after(code, names) == {"fastpool._supervision._supervisor"}


def test_every_public_name_resolves_and_is_listed() -> None:
    out = run_fresh("""
        import fastpool
        missing = [n for n in fastpool.__all__ if n not in dir(fastpool)]
        for n in fastpool.__all__:
            getattr(fastpool, n)
        print(missing, fastpool.pool.Pool is fastpool.Pool,
              fastpool.errors.WorkerCrashed is fastpool.WorkerCrashed)
    """)
    assert out.split("\n")[0] == "[] True True"


def test_naming_the_broken_family_loads_its_stdlib_base_once() -> None:
    out = run_fresh("""
        import sys
        import fastpool
        before = "concurrent.futures.process" in sys.modules
        from concurrent.futures.process import BrokenProcessPool
        from fastpool.errors import WorkerCrashed
        print(before, issubclass(fastpool.WorkerCrashed, BrokenProcessPool),
              fastpool.WorkerCrashed is WorkerCrashed is fastpool.errors.WorkerCrashed)
    """)
    assert out.split() == ["False", "True", "True"]


def test_a_crash_pickled_elsewhere_is_caught_by_a_fresh_process() -> None:
    # A worker's exception crosses to a process that has not named the family yet:
    # unpickling makes it, and `except fastpool.WorkerCrashed` catches the result.
    from fastpool import errors

    crash = errors.WorkerMemoryError(
        3, 4245, -9, 20, "over", reason="oom-killer", limit_bytes=2**30
    )
    data = pickle.dumps(crash)
    out = run_fresh(f"""
        import pickle, sys
        import fastpool
        exc = pickle.loads({data!r})
        from concurrent.futures.process import BrokenProcessPool
        try:
            raise exc
        except fastpool.WorkerCrashed as caught:
            print(type(caught) is fastpool.WorkerMemoryError, isinstance(caught, BrokenProcessPool),
                  caught.reason, caught.limit_bytes)
    """)
    assert out.split() == ["True", "True", "oom-killer", str(2**30)]


_FIRST_POOL = """
    import time
    import fastpool
    import _tasks

    with fastpool.Pool(1, memory_interval_s=0.01) as pool:
        assert pool.submit(_tasks.double, 21).result(timeout=60) == 42
        # until a memory tick has sampled the worker and read the available memory
        # (tests/_waiting.py's wait_for, inline: that module imports psutil)
        def sampled():
            stats = pool.stats()
            return stats["workers"][0]["rss_bytes"] and stats["available_memory_bytes"]

        deadline = time.monotonic() + 30
        while not sampled():
            assert time.monotonic() < deadline, f"no memory sample within 30 s: {pool.stats()}"
            time.sleep(0.005)
"""


@pytest.mark.skipif(
    not Path("/proc/self/statm").exists(), reason="psutil is the reader where /proc is not"
)
def test_a_first_pool_that_sampled_memory_has_not_imported_psutil_or_cloudpickle() -> None:
    names = (
        "psutil",
        "cloudpickle",
        "threadpoolctl",
        "concurrent.futures.process",
        "multiprocessing",
    )
    assert loaded_after(_FIRST_POOL, names) == set()


def test_a_first_pool_loads_the_machinery_but_not_socket_py_or_the_map_engine() -> None:
    # the template's socket pair uses the C module: socket.py costs ~2 ms of a first
    # pool before its template's fork; the map engine (~1 ms, its sizing and chunking
    # classes) comes with the first map
    names = (
        "fastpool._supervision._supervisor",
        "fastpool._runtime._template",
        "socket",
        "fastpool._runtime._mapper",
    )
    assert loaded_after(_FIRST_POOL, names) == set(names[:2])
    mapped = textwrap.dedent(_FIRST_POOL) + "\nwith fastpool.Pool(1) as p:\n    p.map(abs, [-1])\n"
    assert "fastpool._runtime._mapper" in loaded_after(mapped, names)


def test_a_spawned_template_does_not_load_the_parents_machinery() -> None:
    # The template imports this package too; what it has, every worker forks with.
    out = run_fresh(
        """
        import fastpool
        with fastpool.Pool(1) as pool:
            names = pool.submit(eval, "sorted(__import__('sys').modules)").result(timeout=120)
        print(" ".join(names))
    """,
        env={"FASTPOOL_TEMPLATE_START": "spawn"},
    )
    in_worker = set(out.split())
    assert {"fastpool", "fastpool._runtime._worker", "numpy"} <= in_worker
    assert in_worker.isdisjoint(
        {
            "fastpool.pool",
            "fastpool._supervision._supervisor",
            "fastpool._supervision._verdict",
            "fastpool._supervision._sizing",
            "concurrent.futures.process",
            "psutil",
        }
    )


def test_a_worker_looks_like_a_child_once_it_imports_multiprocessing() -> None:
    # Neither the parent nor the template imported multiprocessing, so the worker starts
    # without it; the task's own import makes the worker the owner's named child.
    out = run_fresh("""
        import os, sys
        import fastpool
        import _tasks
        with fastpool.Pool(1) as pool:
            before, name, parent = pool.submit(_tasks.mp_identity).result(timeout=60)
        print(before, name, parent == os.getpid(), "multiprocessing" in sys.modules)
    """)
    assert out.split() == ["False", "fastpool-worker-0", "True", "False"]
