"""scikit-learn's n_jobs= on the fastpool backend gives what n_jobs=1 gives, and really
runs in the pool.  The data (1.2 MB) is over joblib's max_nbytes, so it crosses as one
shared read-only copy per call, which scikit-learn must accept."""

from __future__ import annotations

import numpy as np
import pytest
from joblib import parallel_config

import fastpool.joblib

sklearn = pytest.importorskip("sklearn", reason="needs scikit-learn (the test extra)")
from sklearn.datasets import make_classification  # noqa: E402
from sklearn.ensemble import RandomForestClassifier  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.tree import DecisionTreeClassifier  # noqa: E402


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    X, y = make_classification(n_samples=3000, n_features=50, n_informative=10, random_state=0)
    assert X.nbytes > 2**20
    return X, y


def _in_pool(fit):
    """fit() under the backend with n_jobs=2, and how many batches the pool ran for it."""
    pool = fastpool.joblib.get_pool(2)
    before = pool.stats()["calls_submitted"]
    with parallel_config(backend="fastpool"):
        out = fit()
    assert pool.stats()["calls_submitted"] > before, "nothing ran in the fastpool pool"
    return out


def test_cross_val_score_matches_n_jobs_1(data):
    X, y = data
    est = LogisticRegression(max_iter=300)
    serial = cross_val_score(est, X, y, cv=4, n_jobs=1)
    parallel = _in_pool(lambda: cross_val_score(est, X, y, cv=4, n_jobs=2))
    np.testing.assert_array_equal(parallel, serial)


def test_grid_search_cv_matches_n_jobs_1(data):
    X, y = data
    grid = {"max_depth": [2, 4, None], "min_samples_leaf": [1, 5]}
    serial = GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3, n_jobs=1).fit(X, y)
    parallel = _in_pool(
        lambda: GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3, n_jobs=2).fit(X, y)
    )
    assert parallel.best_params_ == serial.best_params_
    np.testing.assert_array_equal(
        parallel.cv_results_["mean_test_score"], serial.cv_results_["mean_test_score"]
    )


def test_random_forest_matches_n_jobs_1(data):
    X, y = data
    serial = RandomForestClassifier(n_estimators=16, random_state=0, n_jobs=1).fit(X, y)
    forest = RandomForestClassifier(n_estimators=16, random_state=0, n_jobs=2)
    parallel = _in_pool(lambda: forest.fit(X, y))
    np.testing.assert_array_equal(parallel.predict_proba(X), serial.predict_proba(X))


def test_a_pipeline_holding_a_lambda_is_sent_by_value(data):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    X, y = data
    pipe = make_pipeline(FunctionTransformer(lambda z: z * 2.0), LogisticRegression(max_iter=300))
    serial = cross_val_score(pipe, X, y, cv=3, n_jobs=1)
    parallel = _in_pool(lambda: cross_val_score(pipe, X, y, cv=3, n_jobs=2))
    np.testing.assert_array_equal(parallel, serial)
