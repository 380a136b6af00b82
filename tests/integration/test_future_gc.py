"""A pool's futures stay out of the garbage collector's way, and out of leaks.

A new future is not tracked by the cyclic GC (a burst of submits keeps thousands
of them alive, and every young collection would walk them all).  It is tracked
again as soon as it holds something that can lead back to it: a done-callback or
waiter list, or an exception.  A cycle through a future is then collected as any
other; untracked, such a cycle would never be.
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading
from typing import Any

import pytest
from _tasks import announce_then_gate, double, noop, raise_value_error
from _waiting import wait_for


class _Sentinel:
    """Sets ``freed`` when the collector frees it."""

    def __init__(self, freed: threading.Event) -> None:
        self.freed = freed

    def __del__(self) -> None:
        self.freed.set()


def _collected(freed: threading.Event) -> bool:
    gc.collect()
    return freed.is_set()


def test_a_submitted_future_is_not_tracked_until_it_holds_a_waiter_or_an_exception(pool, tmp_path):
    fut = pool.submit(noop)
    assert not gc.is_tracked(fut)
    assert fut.result(timeout=30) is None
    assert not gc.is_tracked(fut)  # a result unpickled from the worker cannot lead back

    started, gate = tmp_path / "started", tmp_path / "gate"
    gated = pool.submit(announce_then_gate, str(started), str(gate))
    done, _ = concurrent.futures.wait([gated], timeout=0)  # installs a waiter: tracked
    assert not done and gc.is_tracked(gated)
    gate.touch()
    assert gated.result(timeout=30) == ""

    failed = pool.submit(raise_value_error, "boom")
    assert isinstance(failed.exception(timeout=30), ValueError)
    assert gc.is_tracked(failed)


def test_a_cycle_through_a_done_callback_is_collected(pool, tmp_path):
    started, gate = tmp_path / "started", tmp_path / "gate"
    freed = threading.Event()
    fut = pool.submit(announce_then_gate, str(started), str(gate))
    sentinel = _Sentinel(freed)
    # fut -> its callback list -> the callback -> fut, with the sentinel aboard
    fut.add_done_callback(lambda f, fut=fut, sentinel=sentinel: None)
    gate.touch()
    assert fut.result(timeout=30) == ""
    del fut, sentinel
    wait_for(lambda: _collected(freed), what="the future's callback cycle to be collected")


def test_a_cycle_through_a_tasks_exception_is_collected(pool):
    freed = threading.Event()
    fut = pool.submit(raise_value_error, "boom")
    exc = fut.exception(timeout=30)
    exc.keep = (fut, _Sentinel(freed))  # fut -> exc -> fut
    del fut, exc
    wait_for(lambda: _collected(freed), what="the future's exception cycle to be collected")


def test_a_cycle_through_a_tasks_container_result_is_collected(pool):
    freed = threading.Event()
    fut = pool.submit(double, [1])
    result = fut.result(timeout=30)
    assert result == [1, 1]
    result.append((fut, _Sentinel(freed)))  # fut -> its result -> fut
    del fut, result
    wait_for(lambda: _collected(freed), what="the future's result cycle to be collected")


@pytest.mark.parametrize("how", ["set_exception", "set_result"])
def test_a_value_set_by_hand_tracks_the_future_too(pool, tmp_path, how):
    # Future's executor-side API, here called by the caller while the task runs
    started, gate = tmp_path / "started", tmp_path / "gate"
    freed = threading.Event()
    fut = pool.submit(announce_then_gate, str(started), str(gate))
    wait_for(started.exists, what="the gated task to start")
    if how == "set_exception":
        value: Any = ValueError("set by hand")
        fut.set_exception(value)
        value.keep = (fut, _Sentinel(freed))  # fut -> exc -> fut
    else:
        value = []
        fut.set_result(value)
        value.append((fut, _Sentinel(freed)))  # fut -> its result -> fut
    gate.touch()  # the task's own result then finds the future settled
    got = fut.exception(timeout=30) if how == "set_exception" else fut.result(timeout=30)
    assert got is value
    del fut, value, got
    wait_for(lambda: _collected(freed), what=f"the cycle through {how}() to be collected")
