"""Results nobody decodes still release their shared blocks (issue 9, section 3).

A worker returns a large array by writing it into its arena region and handing
the parent a reference (a "handoff") that the parent drops when it unpickles the
descriptor.  A result the parent never unpickles -- its task was cancelled, it
answered a task nobody holds, it did not fit the ring -- must drop that reference
some other way, or a long-lived pool slowly fills its arena.  Each test watches
``live_blocks`` (blocks someone references) come back to where it was.
"""

from __future__ import annotations

from concurrent.futures import CancelledError

import pytest
from _arrays import array_with_a_big_pickle, cooperative_array, unrebuildable_then_array
from _faulty import unknown_array_reply
from _tasks import double
from _waiting import live_blocks, wait_for, wait_live_blocks, wait_workers_ready

import fastpool

ARRAY_BYTES = 1 << 20  # over the 64 KiB threshold: travels through the arena


@pytest.fixture
def pool():
    with fastpool.Pool(1) as p:
        wait_workers_ready(p)
        assert p.submit(double, 1).result(timeout=30) == 2
        yield p


def test_a_returned_array_holds_one_block_until_it_is_dropped(pool, tmp_path):
    """The control: the helper's array really travels through the arena."""
    baseline = live_blocks(pool)
    arr = pool.submit(cooperative_array, str(tmp_path / "started"), ARRAY_BYTES, 0.0).result(
        timeout=30
    )
    assert arr.nbytes == ARRAY_BYTES and arr.sum() == ARRAY_BYTES // 8
    assert live_blocks(pool) == baseline + 1
    del arr
    wait_live_blocks(pool, baseline)


def test_a_cooperatively_cancelled_task_returning_an_array_releases_its_block(pool, tmp_path):
    baseline = live_blocks(pool)
    started = tmp_path / "started"
    fut = pool.submit(cooperative_array, str(started), ARRAY_BYTES)
    wait_for(started.exists, what="the task to start")
    assert pool.cancel(fut) is False  # running: only asked; the task reads the flag
    with pytest.raises(CancelledError):
        fut.result(timeout=30)
    wait_live_blocks(pool, baseline)
    assert pool.stats()["calls_cancelled"] == 1


def test_a_reply_for_an_unknown_task_releases_its_block(pool):
    baseline = live_blocks(pool)
    assert pool.submit(unknown_array_reply, (1 << 40) << 3, ARRAY_BYTES).result(timeout=30) is True
    assert pool.submit(double, 2).result(timeout=30) == 4  # read after the stray reply
    assert pool.stats()["unknown_replies"] == 1
    wait_live_blocks(pool, baseline)


def test_a_result_too_big_for_the_ring_spills_and_releases_its_blocks():
    """Its pickle travels in a block of the worker's region (issue 31), handed to the
    parent beside the array's: both are released once the parent has decoded it."""
    with fastpool.Pool(1, ring_bytes=64 << 10) as pool:
        wait_workers_ready(pool)
        baseline = live_blocks(pool)
        arr, items = pool.submit(array_with_a_big_pickle, ARRAY_BYTES, 50_000).result(timeout=30)
        assert items == list(range(50_000)) and arr.sum() == ARRAY_BYTES // 8
        assert live_blocks(pool) == baseline + 1  # the array's block: the spilled pickle's went
        del arr
        wait_live_blocks(pool, baseline)
        assert pool.submit(double, 3).result(timeout=30) == 6  # the worker is fine
        assert pool.stats()["crashed"] == 0


def test_a_result_that_fails_to_unpickle_releases_its_blocks(pool):
    baseline = live_blocks(pool)
    with pytest.raises(fastpool.SerializationError):
        pool.submit(unrebuildable_then_array, ARRAY_BYTES).result(timeout=30)
    assert pool.submit(double, 2).result(timeout=30) == 4
    assert (
        live_blocks(pool) == baseline
    )  # settled: a release would have happened by now; today 1 more
