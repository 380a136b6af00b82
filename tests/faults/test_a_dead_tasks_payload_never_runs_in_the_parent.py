"""Nothing of a dead task runs in the parent (issue 15, section 1).

An argument whose unpickling kills the process that unpickles it (a segfault, os._exit,
C exit()) kills the worker that unpickles it.  The crash record describes the arguments
from facts taken at submit; the parent never unpickles the dead task's bytes, so it
lives, the future fails with WorkerCrashed, and the pool serves the next task.  Each
case runs in a child interpreter: the bug this guards against ends the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

SCRIPT = textwrap.dedent(
    """
    import sys
    import _tasks
    import fastpool
    from fastpool import errors

    with fastpool.Pool(1, backoff_base_s=0.01) as pool:
        doomed = pool.submit(_tasks.identity, _tasks.Harmful(sys.argv[1]))
        try:
            doomed.result(timeout=60)
        except errors.WorkerCrashed as exc:
            print("crashed:", type(exc).__name__, flush=True)
        rec = pool.stats()["crashes"][-1]
        print("args:", rec["args"], flush=True)
        print("next:", pool.submit(_tasks.double, 21).result(timeout=60), flush=True)
    print("parent alive", flush=True)
    """
)


@pytest.mark.faults
@pytest.mark.parametrize("how", ["segfault", "os_exit", "c_exit"])
def test_an_argument_that_kills_its_unpickler_costs_one_worker_not_the_parent(how: str) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("FASTPOOL_TEST_ROOT", str(ROOT))]),
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, (done.returncode, out, done.stderr[-2000:])
    assert "crashed: WorkerCrashed" in out, (out, done.stderr[-2000:])
    assert "args: Harmful" in out  # described from submit, not decoded
    assert "next: 42" in out and "parent alive" in out
