"""Compatibility details with concurrent.futures users hit (issue 15, section 6): a worker
looks like a child process to multiprocessing; initargs with multiprocessing locks and queues
are refused with the alternative named."""

from __future__ import annotations

import multiprocessing
import os

import pytest

import fastpool


def _identity() -> tuple:
    proc = multiprocessing.current_process()
    parent = multiprocessing.parent_process()
    return proc.name, parent is not None and parent.pid, parent is not None and parent.is_alive()


def test_a_worker_looks_like_a_child_process_to_multiprocessing():
    with fastpool.Pool(1) as pool:
        name, parent_pid, alive = pool.submit(_identity).result(timeout=60)
    assert name != "MainProcess" and name.startswith("fastpool-worker-")
    assert parent_pid == os.getpid() and alive


@pytest.mark.parametrize("make", ["Lock", "Queue", "Event"])
def test_initargs_with_a_multiprocessing_lock_queue_or_event_is_a_clear_type_error(make):
    obj = getattr(multiprocessing, make)()
    with pytest.raises(TypeError, match=r"Manager\(\) proxy"):
        fastpool.Pool(1, initializer=print, initargs=(obj,))


def _set_global(value) -> None:
    global SEEN
    SEEN = value


def test_a_manager_proxy_in_initargs_works():
    with multiprocessing.Manager() as m:
        lock = m.Lock()
        with fastpool.Pool(1, initializer=_set_global, initargs=(lock,)) as pool:
            assert pool.submit(os.getpid).result(timeout=60) > 0
