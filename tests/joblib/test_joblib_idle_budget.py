"""Idle pools are bounded in total: a sweep over n_jobs keeps idle no more workers than its
largest pool has, and gives the other pools' workers back within about a second (not after
``idle_worker_timeout``, 300 s by default)."""

from __future__ import annotations

import _joblib_tasks as T
from _joblib_support import workers_alive
from _waiting import wait_for, wait_workers_ready
from joblib import Parallel, delayed, parallel_config

import fastpool.joblib
from fastpool._integrations import _joblib_pools


def test_a_sweep_over_n_jobs_keeps_only_the_largest_pools_workers():
    fastpool.joblib.shutdown()  # the budget counts from here: no pool from another test
    made: dict[int, set[int]] = {}
    for n in (1, 2, 3, 4):  # n_jobs=1 runs in this process: no pool
        with parallel_config(backend="fastpool", n_jobs=n):
            assert Parallel()(delayed(T.square)(i) for i in range(2 * n)) == [
                i * i for i in range(2 * n)
            ]
        if n > 1:  # the pool just used: the most recently used idle pool, kept
            made[n] = set(wait_workers_ready(fastpool.joblib.get_pool(n)))
    assert sorted(made) == [2, 3, 4]
    everyone = set().union(*made.values())
    wait_for(
        lambda: workers_alive() & everyone == made[4],
        what=lambda: f"only the 4-worker pool's {made[4]} alive, not {workers_alive() & everyone}",
    )
    assert [p.workers for p in _joblib_pools.live_pools()] == [4]
    with parallel_config(backend="fastpool", n_jobs=4):  # the kept pool serves the next call
        assert set(Parallel()(delayed(T.pid_of)(i) for i in range(8))) <= made[4]
