"""Regressions found in review: each was a hang, a wrong error or a pool refusing work."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import _faulty
import fastpool
from fastpool import _template

pytestmark = pytest.mark.faults


def test_shutdown_wait_from_a_done_callback_does_not_deadlock():
    fds = len(os.listdir("/proc/self/fd"))
    p = fastpool.Pool(1)
    f = p.submit(_faulty.sleep_then, 1, 0.2)
    done = threading.Event()
    f.add_done_callback(lambda fut: (p.shutdown(wait=True), done.set()))
    assert f.result(timeout=30) == 1
    assert done.wait(30)  # the callback returned instead of waiting on its own thread
    p.shutdown(wait=True)
    end = time.monotonic() + 10
    while time.monotonic() < end and len(os.listdir("/proc/self/fd")) != fds:
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/fd")) == fds  # the collector finished the teardown


def test_timeouts_in_a_row_do_not_open_the_breaker():
    with fastpool.Pool(1, max_failures=3) as p:
        for _ in range(5):
            with pytest.raises(fastpool.TaskTimeout):
                p.options(timeout=0.1).submit(_faulty.sleep_then, 1, 30).result(timeout=30)
        assert p.submit(_faulty.double, 4).result(timeout=30) == 8  # no CircuitOpen
        assert p.stats()["workers"][0]["failures"] == 0


def test_oversized_initargs_fail_pool_creation_naming_them_and_leak_nothing():
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(fastpool.SerializationError, match="initargs"):
            fastpool.Pool(1, ring_bytes=1 << 16, initializer=_faulty.double, initargs=(list(range(100_000)),))
    assert len(os.listdir("/proc/self/fd")) == fds


def test_result_too_big_for_the_arena_is_a_shared_memory_error():
    with fastpool.Pool(1, arena_bytes=8 << 20) as p:
        with pytest.raises(fastpool.SharedMemoryError):
            p.submit(np.ones, 8 << 20).result(timeout=60)  # 64 MiB of float64
        assert p.submit(_faulty.double, 1).result(timeout=30) == 2


def test_workers_of_a_killed_template_are_reported_at_once():
    with fastpool.Pool(2, backoff_base_s=0.01) as p:
        assert p.submit(_faulty.double, 1).result(timeout=30) == 2
        busy = p.submit(_faulty.sleep_then, 1, 30)
        time.sleep(0.3)
        t0 = time.monotonic()
        os.kill(_template.template().pid, signal.SIGKILL)  # both workers die with it
        with pytest.raises(fastpool.WorkerCrashed) as info:
            busy.result(timeout=30)
        assert info.value.exitcode == -signal.SIGKILL
        assert time.monotonic() - t0 < 1.0  # no 1 s wait per worker for a status that cannot come
        assert p.submit(_faulty.double, 3).result(timeout=30) == 6
