"""Shared arrays under real damage: SIGKILLed workers give their references back."""

from __future__ import annotations

import _arrays
import _faulty
import _tasks
import numpy as np
import pytest
from _waiting import wait_workers_ready
from conftest import make_pool

import fastpool

RESULT_S = 60


@pytest.mark.faults
def test_a_sigkilled_worker_holding_views_gives_its_references_back():
    with make_pool(1, backoff_base_s=0.01) as p:
        arr = p.zeros(1 << 20)
        blk = fastpool._runtime._arrays._block_of(arr)
        with pytest.raises(fastpool.WorkerCrashed):
            p.submit(_faulty.hold_then_die, arr).result(timeout=RESULT_S)
        assert p._arena.count(1, blk.off) == 0  # slot 0's counter zeroed by the parent
        off = blk.off
        del arr, blk
        assert p._arena.is_free(off)  # no process holds it: free and reusable
        again = p.zeros(1 << 20)
        assert fastpool._runtime._arrays._block_of(again).off == off
        wait_workers_ready(p)
        assert p.submit(_arrays.total, again + 1).result(timeout=RESULT_S) == 1 << 20


@pytest.mark.faults
def test_a_task_holding_transferred_buffers_is_not_retried():
    with make_pool(1, backoff_base_s=0.01) as p:
        arr = p.zeros(1000)
        fut = p.options(pure=True).submit(_faulty.sigkill_self, fastpool.transfer(arr))
        with pytest.raises(fastpool.WorkerCrashed) as info:
            fut.result(timeout=RESULT_S)
        assert not isinstance(info.value, fastpool.PoisonTask)
        assert p.stats()["retried"] == 0
        plain = p.zeros(1000)
        with pytest.raises(fastpool.PoisonTask):  # the same crash without transfer is retried
            p.options(pure=True).submit(_faulty.sigkill_self, plain).result(timeout=RESULT_S)


@pytest.mark.faults
def test_a_worker_killed_while_its_results_are_live_leaves_them_valid():
    with make_pool(1, backoff_base_s=0.01) as p:
        out = p.submit(_tasks.double, np.ones(1 << 18)).result(timeout=RESULT_S)
        with pytest.raises(fastpool.WorkerCrashed):
            p.submit(_faulty.sigkill_self, None).result(timeout=RESULT_S)
        assert (out == 2.0).all()  # the block lives in the dead worker's region, held by the parent
        blk = fastpool._runtime._arrays._block_of(out)
        assert p._arena.count(0, blk.off) >= 1 and p._arena.count(1, blk.off) == 0


# Exports taken before transfer() (issue 15, section 4): they hold the detached array,
# which used to drop its block at once, so the block went to the next array (the views
# read and wrote that array) and, once the pool shut down, was unmapped under them.
EXPORTS_BEFORE_TRANSFER = r"""
import sys
import numpy as np
import fastpool
sys.path.insert(0, sys.argv[1])
import _arrays

with fastpool.Pool(1) as pool:
    a = pool.zeros(1 << 16)
    a[:] = 1.0
    mv = memoryview(a)
    fb = np.frombuffer(a)
    assert pool.submit(_arrays.total, fastpool.transfer(a)).result(timeout=60) == 1 << 16
    del a
    b = pool.zeros(1 << 16)
    b[:] = 7.0
    assert fb[0] == 1.0 and mv[0] == 1.0, (fb[0], mv[0])  # not the next array's bytes
    fb[1] = 3.0
    assert b[1] == 7.0
print("alive", float(fb.sum()), mv[2], flush=True)  # after shutdown: still mapped
"""


@pytest.mark.faults
def test_exports_taken_before_transfer_keep_their_block_and_outlive_the_pool():
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", EXPORTS_BEFORE_TRANSFER, tests_dir],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["alive", str(float((1 << 16) + 2)), "1.0"]
