"""A pool made inside a task (a nested pool: user code, joblib's nested Parallel).

The template is forked while its handle's lock is held, and every worker is forked
from the template: before the fix a Pool() in a task waited on that inherited lock for
ever.  A worker's pool starts a template of its own (spawned: a worker runs threads),
which ends with the last pool that uses it, and watches the worker's pidfd, so a
SIGKILLed worker leaves neither template nor workers behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import _nested_tasks as N
import pytest
from _tasks import LIMIT_S
from _waiting import running, wait_for, wait_gone
from conftest import make_pool

import fastpool

pytestmark = pytest.mark.linux
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import fastpool, _nested_tasks as N
    from fastpool._runtime import _template
    if __name__ == "__main__":
        with fastpool.Pool(1) as pool:
            out = [pool.submit(N.nested_abs, x).result(timeout=N.RESULT_S) for x in (3, 4)]
            print(type(_template.template()._proc).__name__, flush=True)
        assert [o["value"] for o in out] == [3, 4], out
        assert all(o["worker"] not in o["inner"] for o in out), out
        print("ok", flush=True)
""")


@pytest.mark.parametrize("method, kind", [("", "_ForkedProcess"), ("spawn", "Popen")])
def test_a_pool_made_inside_a_task_returns_the_right_result(tmp_path, method, kind):
    # A fresh interpreter: the bug was in a *forked* template, which a process makes only
    # while it runs one thread (never in this test session, where pools run threads).
    script = tmp_path / "nested.py"
    script.write_text(_SCRIPT.format(tests=TESTS_DIR))
    env = dict(os.environ, FASTPOOL_TEMPLATE_START=method)
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=2 * N.RESULT_S,  # the parent's end also ends its template (its pidfd)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [kind, "ok"], done.stdout


def test_a_nested_pools_processes_are_gone_once_it_closes():
    with make_pool(1) as pool:
        out = pool.submit(N.nested_abs, 5).result(timeout=N.RESULT_S)
        assert len(out["inner"]) == 2 and all(out["inner"])  # its worker and its template
        before, during, after = out["shm"]
        assert during[0] > before[0] and during[1] > before[1]  # its board and arena...
        assert after == before  # ...closed and unmapped once it closed
        wait_gone(out["inner"])  # the task returned: its pool closed, its template too
        assert running(out["worker"])  # while the outer worker lives on


@pytest.mark.faults
def test_a_sigkilled_worker_leaves_no_nested_pool_behind(tmp_path):
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with make_pool(1) as pool:
        fut = pool.submit(N.nested_then_hold, started, gate)
        wait_for(lambda: os.path.exists(started), LIMIT_S, "the nested pool's pids")
        with open(started) as f:
            pids = json.load(f)
        assert all(running(p) for p in pids["inner"])
        os.kill(pids["worker"], signal.SIGKILL)
        with pytest.raises(fastpool.WorkerCrashed):
            fut.result(timeout=N.RESULT_S)
        wait_gone(pids["inner"])  # the inner template saw its parent die, and ended it all
        assert pool.submit(abs, -2).result(timeout=N.RESULT_S) == 2
