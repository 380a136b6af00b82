"""scikit-learn's own tests that make ``Parallel`` calls with more than one worker, on the
fastpool backend and on loky, the control, beside it: a peer suite.

The installed scikit-learn's test files (they ship in the wheel: ``sklearn/*/tests``) run
unchanged, twice, in a child ``python -m pytest`` (tests/_peer_pytest.py) with the
plugin tests/compat/joblib_suite/joblib_backend_plugin.py, which sets joblib's backend for
the whole session: ``"loky"``, then ``"fastpool"``.  A test that names loky itself
(``backend="loky"``, ``parallel_backend("loky")``) runs on loky in both.

SELECTION is two whole modules and the tests of fifteen more whose bodies or parameters
call for ``n_jobs`` above 1, ``Parallel`` or a backend, or read-only data: forests,
bagging, isolation forest, voting, pairwise distances, cross-validation and search,
neighbors, permutation importance, multi-output, column transformer, feature union, RFE
and the linear models' CV (issue 32's full run, 32 modules and 4,817 tests, took far
longer).  Measured on this project's 2-core machine, shared: 137 passed and 17 skipped on
each backend; 96 s on loky and 74 s on fastpool at load 1-4 (the test: 172 s); 204 s and
191 s at load 15; about 14 minutes for the test at load 19 (one run each).

Every test must pass or be skipped on loky; on fastpool every test must end as on loky,
or fail as listed in EXPECTED_FAILURES, each a row of docs/joblib.md ("scikit-learn's own
tests") with its reason.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from _peer_pytest import count, run_suite, undocumented

sklearn = pytest.importorskip("sklearn", reason="needs the test extra: pip install -e '.[test]'")


SELECTION = (
    "utils/tests/test_parallel.py",
    "inspection/tests/test_permutation_importance.py",
    "ensemble/tests/test_forest.py::test_importances",
    "ensemble/tests/test_forest.py::test_parallel",
    "ensemble/tests/test_forest.py::test_parallel_train",
    "ensemble/tests/test_forest.py::test_backend_respected",
    "ensemble/tests/test_forest.py::test_mse_criterion_object_segfault_smoke_test",
    "ensemble/tests/test_forest.py::test_read_only_buffer",
    "ensemble/tests/test_bagging.py::test_parallel_classification",
    "ensemble/tests/test_bagging.py::test_parallel_regression",
    "ensemble/tests/test_bagging.py::test_estimator",
    "ensemble/tests/test_iforest.py::test_iforest_parallel_regression",
    "ensemble/tests/test_iforest.py::test_iforest_with_n_jobs_does_not_segfault",
    "ensemble/tests/test_iforest.py::test_iforest_predict_parallel",
    "ensemble/tests/test_voting.py::test_parallel_fit",
    "metrics/tests/test_pairwise.py::test_pairwise_parallel",
    "metrics/tests/test_pairwise.py::test_parallel_pairwise_distances_diagonal",
    "metrics/tests/test_pairwise.py::test_parallel_pairwise_distances_y_norm_squared",
    "metrics/tests/test_pairwise.py::test_pairwise_distances_data_derived_params",
    "metrics/tests/test_pairwise.py::test_sparse_manhattan_readonly_dataset",
    "model_selection/tests/test_validation.py::test_cross_validate_many_jobs",
    "model_selection/tests/test_validation.py::test_cross_validate_return_indices",
    "model_selection/tests/test_search.py::test_empty_cv_iterator_error",
    "model_selection/tests/test_search.py::test_random_search_bad_cv",
    "model_selection/tests/test_search.py::test_search_with_2d_array",
    "neighbors/tests/test_neighbors.py::test_same_knn_parallel",
    "neighbors/tests/test_neighbors.py::test_same_radius_neighbors_parallel",
    "neighbors/tests/test_neighbors.py::test_radius_neighbors_parallel_array_radius",
    "neighbors/tests/test_neighbors.py::test_knn_forcing_backend",
    "tests/test_multioutput.py::test_multi_output_classification_partial_fit_parallelism",
    "compose/tests/test_column_transformer.py::test_column_transformer_auto_memmap",
    "tests/test_pipeline.py::test_feature_union_parallel",
    "feature_selection/tests/test_rfe.py::test_rfe_cv_n_jobs",
    "feature_selection/tests/test_rfe.py::test_results_per_cv_in_rfecv",
    "linear_model/tests/test_coordinate_descent.py::test_lasso_readonly_data",
    "linear_model/tests/test_coordinate_descent.py::test_multi_task_lasso_readonly_data",
    "linear_model/tests/test_coordinate_descent.py::test_linear_models_cv_fit_with_loky",
)

# test id (without the path) -> why it fails on fastpool: each a row of docs/joblib.md
EXPECTED_FAILURES: dict[str, str] = {}

GOOD = ("passed", "skipped", "xfailed", "xpassed")


def test_every_expected_failure_is_a_documented_row() -> None:
    missing = undocumented(EXPECTED_FAILURES)
    assert not missing, f"not in docs/joblib.md: {missing}"


@pytest.mark.peer_suite
@pytest.mark.timeout(1500)
def test_sklearn_suite_on_fastpool_ends_as_on_loky(tmp_path: Path) -> None:
    package = Path(sklearn.__file__).parent
    targets = [str(package / t) for t in SELECTION]
    runs, seconds = {}, {}
    for backend in ("loky", "fastpool"):
        start = time.monotonic()
        runs[backend] = run_suite(
            tmp_path / backend,
            package,
            targets,
            ["joblib_backend_plugin"],
            {"FASTPOOL_SUITE_BACKEND": backend},
            timeout_s=720,
            # test_parallel_train fits with n_jobs up to 32: 80 s on 2 cores at load 15
            per_test_s=600,
        )
        seconds[backend] = round(time.monotonic() - start)
    loky, fastpool = runs["loky"], runs["fastpool"]
    bad = [
        f"loky {k}: {r['outcome']}\n{r['detail']}"
        for k, r in loky.items()
        if r["outcome"] not in GOOD
    ]
    assert loky.keys() == fastpool.keys(), loky.keys() ^ fastpool.keys()
    for nodeid, row in fastpool.items():
        key = nodeid.split("::", 1)[1]
        if key in EXPECTED_FAILURES:
            if row["outcome"] != "failed":
                bad.append(f"{key}: listed as an expected failure, but {row['outcome']}")
        elif row["outcome"] not in GOOD or (
            loky[nodeid]["outcome"] == "passed" and row["outcome"] != "passed"
        ):
            was = loky[nodeid]["outcome"]
            bad.append(f"fastpool {key}: {row['outcome']} (loky: {was})\n{row['detail']}")
    counts = {backend: count(rows)[backend] for backend, rows in runs.items()}
    print(json.dumps({"counts": counts, "seconds": seconds}), file=sys.stderr)
    assert counts["fastpool"].get("passed", 0) >= 120, counts  # the suite really ran
    assert not bad, "\n\n".join(bad)
