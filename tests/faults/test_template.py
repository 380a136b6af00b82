"""The worker template: the process that forks workers must not be a single point of failure."""

import os
import signal
import threading
import time

import pytest

import _faulty
import fastpool
from fastpool import WorkerCrashed, _template

pytestmark = pytest.mark.faults


def test_pool_created_in_a_thread_that_exits_keeps_working():
    fastpool.shutdown_template()  # the next pool starts a template from the thread below
    box = {}

    def make():
        box["pool"] = fastpool.Pool(1, backoff_base_s=0.01)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    p = box["pool"]
    try:
        time.sleep(0.3)  # a template tied to the dead thread would be gone by now
        assert p.submit(_faulty.double, 5).result(timeout=30) == 10
        assert p.stats()["crashed"] == 0
    finally:
        p.shutdown()


def test_killed_template_is_replaced_and_the_pool_goes_on():
    with fastpool.Pool(2, backoff_base_s=0.01) as p:
        assert p.submit(_faulty.double, 1).result(timeout=30) == 2
        running = p.submit(_faulty.sleep_then, 1, 30)
        time.sleep(0.2)
        old = _template.template().pid
        os.kill(old, signal.SIGKILL)  # its workers die with it
        with pytest.raises(WorkerCrashed):
            running.result(timeout=30)
        assert [p.submit(_faulty.double, i).result(timeout=30) for i in range(4)] == [0, 2, 4, 6]
        assert _template.template().pid not in (None, old)
