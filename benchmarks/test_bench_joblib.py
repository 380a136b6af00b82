"""joblib's ``Parallel`` on the fastpool backend against joblib's default, loky, in the
same run: the same calls under ``parallel_config(backend=..., n_jobs=2)``.

Groups (one table each, ratios to fastpool; nothing asserts a time):

* 256 MiB X read by 8 tasks: ``Parallel()(delayed(part_total)(X, i, 8) for i in range(8))``,
  each task summing its eighth of X.  loky memmaps X (over ``max_nbytes``, 1 MB): it
  hashes X on every call to name the file, writes it the first time, and each task maps
  it.  fastpool copies X once per call into shared memory, read-only.
* 3,000 tiny tasks: ``delayed(square)(i)``, joblib's auto-batching on both.
* GridSearchCV: a logistic regression over 4 values of C, 3 folds, on 20,000 x 40
  (6.4 MB, so it crosses as shared memory / a memmap), ``n_jobs=2``; with the peak RSS
  and PSS of parent plus workers from a separate, untimed run (``peak_memory``).

Each peer is warmed first (workers started, scikit-learn imported in them); loky's
reusable executor and fastpool's cached pool both live across the rounds, as they do
across a user's calls.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import _tasks
import numpy as np
import pytest
from _peers import median_s, peak_memory, tag

joblib = pytest.importorskip("joblib", reason="needs the joblib extra: pip install -e '.[joblib]'")
from joblib import Parallel, delayed, parallel_config  # noqa: E402

import fastpool.joblib  # noqa: E402

WORKERS = 2
PEERS = ["fastpool", "loky"]
TINY_TASKS = 3000
X_MIB = 256


@contextlib.contextmanager
def _backend(name: str) -> Iterator[None]:
    with parallel_config(backend=name, n_jobs=WORKERS):
        try:
            yield
        finally:
            if name == "fastpool":
                fastpool.joblib.shutdown()
            else:  # the reusable executor these calls used: same arguments, same executor
                with Parallel() as p:
                    executor = p._backend._workers
                executor.shutdown(wait=True, kill_workers=True)


@pytest.fixture(params=PEERS)
def peer(request: pytest.FixtureRequest) -> Iterator[str]:
    with _backend(request.param):
        Parallel()(delayed(_tasks.square)(i) for i in range(4 * WORKERS))  # workers up
        yield request.param


@pytest.fixture(scope="module")
def big_x() -> np.ndarray:
    return np.random.default_rng(0).random((X_MIB * 2**20 // 8 // 1024, 1024))


def test_joblib_256mib_x_read_by_8_tasks(benchmark, peer, big_x):
    benchmark.group = f"joblib: a {X_MIB} MiB X read by 8 tasks, {WORKERS} workers"
    expected = float(big_x.sum())

    def call() -> list[float]:
        return Parallel()(delayed(_tasks.part_total)(big_x, i, 8) for i in range(8))

    out = benchmark.pedantic(call, rounds=7, iterations=1, warmup_rounds=1)
    assert abs(sum(out) - expected) < 1e-6 * expected
    tag(benchmark, peer, mib=X_MIB, **peak_memory(call))


def test_joblib_3000_tiny_tasks(benchmark, peer):
    benchmark.group = f"joblib: {TINY_TASKS:,} tiny tasks, {WORKERS} workers"

    def call() -> list[int]:
        return Parallel()(delayed(_tasks.square)(i) for i in range(TINY_TASKS))

    out = benchmark.pedantic(call, rounds=30, iterations=1, warmup_rounds=2)
    assert out[-1] == (TINY_TASKS - 1) ** 2
    median = median_s(benchmark)
    tag(benchmark, peer, tasks_per_s=round(TINY_TASKS / median) if median else None)


def test_joblib_grid_search_cv(benchmark, peer):
    sklearn = pytest.importorskip("sklearn", reason="needs scikit-learn (the test extra)")
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    benchmark.group = f"joblib: GridSearchCV, 4 x 3 fits on 20,000 x 40, {WORKERS} workers"
    X, y = make_classification(n_samples=20_000, n_features=40, n_informative=12, random_state=0)

    def call() -> Any:
        search = GridSearchCV(
            LogisticRegression(max_iter=500), {"C": [0.01, 0.1, 1.0, 10.0]}, cv=3, n_jobs=WORKERS
        )
        return search.fit(X, y)

    search = benchmark.pedantic(call, rounds=3, iterations=1, warmup_rounds=1)
    assert search.best_score_ > 0.5
    tag(benchmark, peer, sklearn=sklearn.__version__, **peak_memory(call))
