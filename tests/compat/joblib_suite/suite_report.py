"""A pytest plugin (``-p suite_report``) that writes each test's outcome to the JSON file
named by ``FASTPOOL_JOBLIB_REPORT``: node id -> {"outcome", "detail", "kind"}.

``kind`` says which backend the test ran on: ``kind_of(item)``, which a plugin loaded with
this one may replace (joblib's suite tells its loky and fastpool cases apart by their
parameters); by default it is the session's backend, ``FASTPOOL_SUITE_BACKEND``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

_rows: dict[str, dict[str, Any]] = {}


def _session_backend(item: pytest.Item) -> str:
    return os.environ.get("FASTPOOL_SUITE_BACKEND", "other")


kind_of: Callable[[pytest.Item], str] = _session_backend


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = _rows.setdefault(report.nodeid, {"outcome": "not run", "detail": "", "kind": "other"})
    if getattr(report, "wasxfail", None) is not None:
        row["outcome"] = "xfailed" if report.skipped else "xpassed"
    elif report.failed:  # a failed teardown fails a passed test too
        row["outcome"], row["detail"] = "failed", str(report.longrepr)[-3000:]
    elif report.skipped and row["outcome"] == "not run":
        row["outcome"], row["detail"] = "skipped", str(report.longrepr)[-300:]
    elif report.when == "call" and row["outcome"] == "not run":
        row["outcome"] = "passed"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        _rows[item.nodeid] = {"outcome": "not run", "detail": "", "kind": kind_of(item)}


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("FASTPOOL_JOBLIB_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_rows, f, indent=1)
