"""Real damage inside a joblib call on the fastpool backend: the call fails with a
specific error, only its own batches stop, and the same pool serves the next call."""

from __future__ import annotations

import multiprocessing
import os

import _joblib_tasks as T
import pytest
from _waiting import wait_for
from joblib import Parallel, delayed, parallel_config

import fastpool
import fastpool.joblib

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("die, signal_name", [(T.sigkill_self, "SIGKILL"), (T.segfault, "SIGSEGV")])
def test_a_dead_worker_fails_the_call_with_worker_crashed_and_the_pool_survives(die, signal_name):
    pool = fastpool.joblib.get_pool(2)
    with parallel_config(backend="fastpool", n_jobs=2):
        with pytest.raises(fastpool.WorkerCrashed) as info:
            Parallel()(delayed(die)() if i == 3 else delayed(T.square)(i) for i in range(6))
        assert info.value.signal_name == signal_name and signal_name in str(info.value)
        assert f"1 call(s) of {die.__name__}" in "".join(info.value.__notes__)
        assert Parallel()(delayed(T.square)(i) for i in range(6)) == [i * i for i in range(6)]
    assert fastpool.joblib.get_pool(2) is pool and pool.workers == 2


def test_parallel_timeout_stops_the_slow_task_only(tmp_path):
    pool = fastpool.joblib.get_pool(2)
    slow_pid_file = str(tmp_path / "slow.pid")
    with parallel_config(backend="fastpool", n_jobs=2):
        Parallel()(delayed(T.square)(i) for i in range(4))  # both workers up
        before = set(pool.pids())
        with pytest.raises(multiprocessing.TimeoutError):  # joblib's own, not the builtin
            Parallel(timeout=3, batch_size=1)(
                [delayed(T.report_then_hang)(slow_pid_file)]
                + [delayed(T.square)(i) for i in range(4)]
            )
        with open(slow_pid_file) as f:
            slow = int(f.read())
        wait_for(lambda: slow not in pool.pids(), 30.0, "the slow task's worker to be killed")
        assert before - {slow} <= set(pool.pids()), "a worker with no slow task was stopped too"
        assert Parallel()(delayed(T.square)(i) for i in range(4)) == [0, 1, 4, 9]


def test_an_error_stops_the_calls_running_batches_but_no_other_worker(tmp_path):
    pool = fastpool.joblib.get_pool(2)
    hang_pid_file = str(tmp_path / "hang.pid")
    with parallel_config(backend="fastpool", n_jobs=2):
        Parallel()(delayed(T.square)(i) for i in range(4))
        with pytest.raises(T.OddError):
            Parallel(batch_size=1)(
                [
                    delayed(T.report_then_hang)(hang_pid_file),
                    delayed(T.wait_for_file)(hang_pid_file, None),
                    delayed(T.raise_odd)("stop"),
                ]
            )
        with open(hang_pid_file) as f:
            hung = int(f.read())
        wait_for(lambda: hung not in pool.pids(), 30.0, "the abandoned batch's worker to be killed")
        assert Parallel()(delayed(T.pid_of)(i) for i in range(2))
    assert os.getpid() not in pool.pids()


EXIT_SCRIPT = """
import sys
import time

sys.path.insert(0, {tests!r})
import _joblib_tasks as T
from joblib import Parallel, delayed, parallel_config

import fastpool.joblib

log, release = sys.argv[1], sys.argv[2]
if __name__ == "__main__":
    with parallel_config(backend="fastpool", n_jobs=2):
        # 8 batches submitted at once; nobody reads the generator's results
        gen = Parallel(return_as="generator", batch_size=1, pre_dispatch="all")(
            delayed(T.note_then_wait)(log, release, i) for i in range(8)
        )
        deadline = time.monotonic() + 60
        while open(log).read().count("\\n") < 2:  # both workers run one
            assert time.monotonic() < deadline, "no task started"
            time.sleep(0.01)
        open(release, "w").close()  # the two running may end; the script ends now
    print("OK")
"""


def test_exit_cancels_the_batches_an_abandoned_call_left(tmp_path):
    import subprocess
    import sys

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "abandon.py"
    script.write_text(EXIT_SCRIPT.format(tests=tests))
    log, release = tmp_path / "log", tmp_path / "release"
    log.write_text("")
    proc = subprocess.run(
        [sys.executable, str(script), str(log), str(release)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    ran = log.read_text().split()
    # the two running finish; a worker's prefetched one may too; the rest never run
    assert len(ran) <= 4, f"{len(ran)} of 8 abandoned batches ran at exit: {ran}"
