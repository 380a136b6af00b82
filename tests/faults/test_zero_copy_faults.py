"""Shared arrays under real damage: SIGKILLed workers give their references back."""

from __future__ import annotations

import time

import _arrays
import numpy as np
import pytest
from conftest import make_pool

import fastpool

RESULT_S = 60


def _wait_ready(pool: fastpool.Pool) -> None:
    deadline = time.monotonic() + RESULT_S
    while any(w["state"] != "ready" for w in pool.stats()["workers"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.faults
def test_a_sigkilled_worker_holding_views_gives_its_references_back():
    with make_pool(1, backoff_base_s=0.01) as p:
        arr = p.zeros(1 << 20)
        blk = fastpool._runtime._arrays._block_of(arr)
        with pytest.raises(fastpool.WorkerCrashed):
            p.submit(_arrays.hold_then_die, arr).result(timeout=RESULT_S)
        assert p._arena.count(1, blk.off) == 0  # slot 0's counter zeroed by the parent
        off = blk.off
        del arr, blk
        assert p._arena.is_free(off)  # no process holds it: free and reusable
        again = p.zeros(1 << 20)
        assert fastpool._runtime._arrays._block_of(again).off == off
        _wait_ready(p)
        assert p.submit(_arrays.total, again + 1).result(timeout=RESULT_S) == 1 << 20


@pytest.mark.faults
def test_a_task_holding_transferred_buffers_is_not_retried():
    with make_pool(1, backoff_base_s=0.01) as p:
        arr = p.zeros(1000)
        fut = p.options(pure=True).submit(_arrays.die, fastpool.transfer(arr))
        with pytest.raises(fastpool.WorkerCrashed) as info:
            fut.result(timeout=RESULT_S)
        assert not isinstance(info.value, fastpool.PoisonTask)
        assert p.stats()["retried"] == 0
        plain = p.zeros(1000)
        with pytest.raises(fastpool.PoisonTask):  # the same crash without transfer is retried
            p.options(pure=True).submit(_arrays.die, plain).result(timeout=RESULT_S)


@pytest.mark.faults
def test_a_worker_killed_while_its_results_are_live_leaves_them_valid():
    with make_pool(1, backoff_base_s=0.01) as p:
        out = p.submit(_arrays.double, np.ones(1 << 18)).result(timeout=RESULT_S)
        with pytest.raises(fastpool.WorkerCrashed):
            p.submit(_arrays.die, None).result(timeout=RESULT_S)
        assert (out == 2.0).all()  # the block lives in the dead worker's region, held by the parent
        blk = fastpool._runtime._arrays._block_of(out)
        assert p._arena.count(0, blk.off) >= 1 and p._arena.count(1, blk.off) == 0
