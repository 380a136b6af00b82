"""A forked child never touches its parent's pool (issue 15, section 4).

The child of a process holding pools (the parent, or a worker running a task) gets
copies of every pool object and of every arena-backed array.  Its exit must not stop
the parent's workers, and what it writes into those arrays stays its own, as with any
memory after fork()."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import _arrays
import numpy as np
import pytest
from _tasks import announce_then_gate
from _waiting import wait_for, wait_workers_ready
from conftest import make_pool

import fastpool

RESULT_S = 60


def _in_child(fn) -> int:
    """Runs fn in a forked child; its exit code (0: fn returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = 0 if fn() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


CHILD_EXITS = r"""
import os, sys
import fastpool
from _waiting import wait_workers_ready

pool = fastpool.Pool(2)
assert pool.submit(abs, -1).result(timeout=60) == 1
before = sorted(wait_workers_ready(pool))  # the first result may come before the second worker
pid = os.fork()
if pid == 0:
    sys.exit(0)  # runs the atexit hooks and the pool's finaliser in the child
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
assert [pool.submit(abs, -i).result(timeout=60) for i in range(20)] == list(range(20))
stats = pool.stats()
assert sorted(pool.pids()) == before, (before, pool.pids())
assert stats["crashed"] == 0 and stats["killed"] == 0, stats
pool.shutdown()
print("ok", flush=True)
"""


@pytest.mark.faults
def test_a_forked_childs_exit_leaves_the_parents_workers_serving():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", CHILD_EXITS], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]
    assert "crash" not in out.stderr and "damaged" not in out.stderr, out.stderr[-3000:]


def test_a_forked_childs_writes_to_shared_arrays_stay_in_the_child(pool):
    arr = pool.zeros(1 << 16)
    result = pool.submit(np.add, pool.zeros(1 << 16), 1.0).result(timeout=RESULT_S)
    assert result.sum() == 1 << 16

    def write() -> bool:
        arr[:] = 5.0
        result[:] = 5.0
        return arr.sum() == 5.0 * (1 << 16)

    assert _in_child(write) == 0
    assert arr.sum() == 0.0 and result.sum() == 1 << 16  # the parent's bytes are its own
    assert pool.submit(np.sum, arr).result(timeout=RESULT_S) == 0.0  # and its workers'


def test_a_forked_child_cannot_submit_to_its_parents_pool(pool):
    def submit() -> bool:
        try:
            pool.submit(abs, -1)
        except fastpool.PoolClosed:
            return True
        return False

    assert _in_child(submit) == 0
    assert pool.submit(abs, -3).result(timeout=RESULT_S) == 3


def test_a_task_that_forks_keeps_its_hook_arrays_copy_on_write():
    with make_pool(1) as p:
        seen = p.submit(_arrays.fork_writes_stay_in_the_child, 1 << 18).result(timeout=RESULT_S)
    assert seen == dict(in_arena=True, child_ok=True, seen=float(1 << 18))


def test_a_forked_childs_result_on_an_inherited_future_leaves_the_parents_worker_alone(
    pool, tmp_path
):
    """Issue 23, defect 10: the child's result() on a future it inherited unsettled raises
    PoolClosed at once, and so ends its wait(); it never drives its copy of the board (whose
    pages the worker still writes) nor signals the worker through the inherited pidfds.
    A future settled before the fork keeps its value in the child.  The child opens the
    task's gate itself, so that the worker writes its reply while the child waits."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    pids = sorted(wait_workers_ready(pool))
    done = pool.submit(abs, -7)
    assert done.result(timeout=RESULT_S) == 7
    fut = pool.submit(announce_then_gate, str(started), str(gate))
    wait_for(started.exists, what="the task to start")
    queued = pool.submit(abs, -3)

    def wait_in_child() -> bool:
        gate.touch()
        try:
            fut.result(timeout=RESULT_S)  # before the fix: "", and the parent's worker killed
        except fastpool.PoolClosed as exc:
            ok = "forked" in str(exc)
        else:
            return False
        with pytest.raises(fastpool.PoolClosed):
            queued.result()  # no timeout: before the fix, a hang
        waited = concurrent.futures.wait([fut, queued], timeout=RESULT_S)
        return ok and not waited.not_done and done.result(timeout=0) == 7

    assert _in_child(wait_in_child) == 0
    assert fut.result(timeout=RESULT_S) == ""
    assert queued.result(timeout=RESULT_S) == 3
    stats = pool.stats()
    assert (stats["crashed"], stats["killed"]) == (0, 0), stats["crashes"]
    assert sorted(pool.pids()) == pids
