"""Regressions found in review: each was a hang, a wrong error or a pool refusing work."""

import os
import signal
import threading
import time

import _tasks
import numpy as np
import pytest
from _waiting import wait_for

import fastpool
from fastpool._runtime import _template

pytestmark = pytest.mark.faults


def test_shutdown_wait_from_a_done_callback_does_not_deadlock(tmp_path):
    fds = len(os.listdir("/proc/self/fd"))
    gate = tmp_path / "open"
    p = fastpool.Pool(1)
    f = p.submit(_tasks.gate, str(gate), 1)  # not done before the callback is added
    done = threading.Event()
    threads: list = []
    f.add_done_callback(
        lambda fut: (threads.append(threading.current_thread()), p.shutdown(wait=True), done.set())
    )
    gate.touch()
    # Waiting on the event, not in f.result(): a thread inside result() drives the
    # pool itself and would run the callback, and the claim is about the pool's thread.
    assert done.wait(30)  # the callback returned instead of waiting on its own thread
    assert threads != [threading.main_thread()]
    assert f.result(timeout=0)[0] == 1
    p.shutdown(wait=True)
    wait_for(
        lambda: len(os.listdir("/proc/self/fd")) == fds,
        10,
        "the collector to finish the teardown and close its fds",
    )


def test_timeouts_in_a_row_do_not_open_the_breaker():
    with fastpool.Pool(1, max_failures=3) as p:
        for _ in range(5):
            with pytest.raises(fastpool.TaskTimeout):
                p.options(timeout=0.1).submit(_tasks.sleep_then, 1, 30).result(timeout=30)
        assert p.submit(_tasks.double, 4).result(timeout=30) == 8  # no CircuitOpen
        assert p.stats()["workers"][0]["failures"] == 0


def test_oversized_initargs_fail_pool_creation_naming_them_and_leak_nothing():
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(fastpool.SerializationError, match="initargs"):
            fastpool.Pool(
                1, ring_bytes=1 << 16, initializer=_tasks.double, initargs=(list(range(100_000)),)
            )
    assert len(os.listdir("/proc/self/fd")) == fds


def test_result_too_big_for_the_arena_is_a_shared_memory_error():
    with fastpool.Pool(1, arena_bytes=8 << 20) as p:
        with pytest.raises(fastpool.SharedMemoryError):
            p.submit(np.ones, 8 << 20).result(timeout=60)  # 64 MiB of float64
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2


def test_workers_of_a_killed_template_are_reported_at_once(tmp_path):
    started = tmp_path / "started"
    with fastpool.Pool(2, backoff_base_s=0.01) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        busy = p.submit(_tasks.touch_then_sleep, str(started), 1, 30)
        wait_for(started.exists, what="the task to start")
        t0 = time.monotonic()
        os.kill(_template.template().pid, signal.SIGKILL)  # both workers die with it
        with pytest.raises(fastpool.WorkerCrashed) as info:
            busy.result(timeout=30)
        assert info.value.exitcode == -signal.SIGKILL
        assert time.monotonic() - t0 < 1.0  # no 1 s wait per worker for a status that cannot come
        assert p.submit(_tasks.double, 3).result(timeout=30) == 6
