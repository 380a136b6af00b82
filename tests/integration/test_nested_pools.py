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

import _nested_tasks as N
import pytest
from _tasks import LIMIT_S
from _waiting import running, wait_for, wait_gone
from conftest import make_pool

import fastpool

pytestmark = pytest.mark.linux


def test_a_pool_made_inside_a_task_returns_the_right_result():
    with make_pool(1) as pool:
        out = pool.submit(N.nested_abs, 3).result(timeout=N.RESULT_S)
        again = pool.submit(N.nested_abs, 4).result(timeout=N.RESULT_S)  # a second one, too
    assert out["value"] == 3 and again["value"] == 4
    assert out["worker"] not in out["inner"]


def test_a_nested_pools_processes_are_gone_once_it_closes():
    with make_pool(1) as pool:
        out = pool.submit(N.nested_abs, 5).result(timeout=N.RESULT_S)
        assert len(out["inner"]) == 2 and all(out["inner"])  # its worker and its template
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
