"""``fastpool.mp.Pool`` where multiprocessing's own pool tests found it was no drop-in.

Each test names the case of CPython's ``test._test_multiprocessing`` it stands for (the whole
suite runs through tests/compat/cpython_mp.py, a peer suite); here each runs on its own,
against ``multiprocessing.Pool`` as well where multiprocessing defines the behaviour, so the
expectation is the stdlib's and not ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WAIT_S = 60

# A script run as __main__ in a fresh process, so that its first pool makes the worker
# template: what the parent did before that pool is what the template (and every worker
# forked from it) inherits.
PROXIES_BEFORE_THE_FIRST_POOL = textwrap.dedent("""
    import multiprocessing
    import os
    import sys

    ctx = multiprocessing.get_context(sys.argv[2])
    if sys.argv[1] == "fastpool":
        from fastpool.mp import Pool
    else:
        Pool = ctx.Pool

    def initializer(seen):
        seen.append(os.getpid())

    def read(ns):
        return ns.x, os.getpid()

    if __name__ == "__main__":
        with ctx.Manager() as manager:
            ns = manager.Namespace()
            ns.x = 7  # the parent's proxy now holds a connection to the manager
            seen = manager.list()
            pool = Pool(2, initializer, (seen,))
            got = [pool.apply(read, (ns,)), *pool.map(read, [ns] * 4, chunksize=1)]
            pool.close()
            pool.join()
            assert {x for x, _ in got} == {7}, got
            assert {pid for _, pid in got} <= set(seen), (got, seen)
            print("OK")
""")


def _run(tmp_path: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
    )


@pytest.mark.parametrize(
    ("kind", "method", "template"),
    [
        ("multiprocessing", "fork", ""),
        ("multiprocessing", "forkserver", ""),
        ("fastpool", "fork", "fork"),
        ("fastpool", "forkserver", "fork"),  # 3.14's default start method
        ("fastpool", "forkserver", "spawn"),
    ],
)
def test_manager_proxies_work_in_workers_after_the_parent_used_them(
    tmp_path: Path, kind: str, method: str, template: str
) -> None:
    """TestInitializers.test_pool_initializer: a proxy the parent used before its first pool
    works in the initializer and in tasks, whichever start method made the manager. A forked
    template (as for a small parent with one thread) inherits the parent's cached connection
    to the manager; a spawned one inherits nothing but must share the parent's authkey."""
    proc = _run(
        tmp_path, PROXIES_BEFORE_THE_FIRST_POOL, kind, method, FASTPOOL_TEMPLATE_START=template
    )
    assert proc.returncode == 0 and proc.stdout == "OK\n", proc.stdout + proc.stderr[-3000:]
