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
