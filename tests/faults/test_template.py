"""The worker template: the process that forks workers must not be a single point of failure."""

import os
import signal
import threading

import _tasks
import pytest
from _waiting import running, wait_for

import fastpool
from fastpool import WorkerCrashed
from fastpool._runtime import _template

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
        tpid = _template.template().pid
        # PR_SET_PDEATHSIG fires when the creating *thread* exits, and the kernel sends
        # it before the thread leaves /proc/self/task: once it has left, a template
        # tied to it has been sent its SIGKILL.
        wait_for(
            lambda: str(t.native_id) not in os.listdir("/proc/self/task"),
            what="the creating thread to exit",
        )
        assert p.submit(_tasks.double, 5).result(timeout=30) == 10
        assert _template.template().pid == tpid and running(tpid)
        assert p.stats()["crashed"] == 0
    finally:
        p.shutdown()


def test_killed_template_is_replaced_and_the_pool_goes_on(tmp_path):
    with fastpool.Pool(2, backoff_base_s=0.01) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        busy = p.submit(_tasks.touch_then_sleep, str(tmp_path / "started"), 1, 30)
        wait_for((tmp_path / "started").exists, what="the task to start")
        old = _template.template().pid
        os.kill(old, signal.SIGKILL)  # its workers die with it
        with pytest.raises(WorkerCrashed):
            busy.result(timeout=30)
        assert [p.submit(_tasks.double, i).result(timeout=30) for i in range(4)] == [0, 2, 4, 6]
        assert _template.template().pid not in (None, old)


_START = """
import os, sys
sys.path.insert(0, {tests!r})
import fastpool, _tasks
from fastpool._runtime import _template
if __name__ == "__main__":
    import numpy as np
    ballast = np.ones(int(os.environ.get("BALLAST_MIB", "0")) * 2**17)  # a big parent is not forked
    if os.environ.get("NATIVE_THREAD") == "1":
        import faulthandler
        faulthandler.dump_traceback_later(600)  # a C thread that threading does not list
    r, w = os.pipe()  # opened before the template: it must not keep w open
    with fastpool.Pool(2) as p:
        assert sorted(p.map(_tasks.double, range(10))) == [2 * i for i in range(10)]
        tpid = _template.template().pid
        os.close(w)
        assert os.read(r, 1) == b"", "the template holds the parent's pipe open"
        kind = type(_template.template()._proc).__name__
    print(kind, tpid != os.getpid(), flush=True)
"""


@pytest.mark.parametrize(
    "method, ballast_mib, native_thread, proc_type",
    [
        ("", 0, False, "_ForkedProcess"),
        ("spawn", 0, False, "Popen"),
        ("", 400, False, "Popen"),  # a big parent would be pinned by a forked template
        ("", 0, True, "Popen"),  # forking beside a native thread is unsafe (CPython 3.12+ warns)
    ],
)
def test_template_start_methods(tmp_path, method, ballast_mib, native_thread, proc_type):
    import subprocess
    import sys

    script = tmp_path / "start.py"
    script.write_text(
        _START.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    # one BLAS thread: the parent then runs no native thread, and forking it is safe
    env = dict(
        os.environ,
        FASTPOOL_TEMPLATE_START=method,
        BALLAST_MIB=str(ballast_mib),
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        NATIVE_THREAD="1" if native_thread else "0",
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [proc_type, "True"]
