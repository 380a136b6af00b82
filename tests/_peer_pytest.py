"""What the peer suites written for pytest share (joblib's, scikit-learn's): their installed
test files, unchanged, in a child ``python -m pytest`` with plugins from
tests/compat/joblib_suite/, and each test's outcome as a row of the report that the plugin
suite_report writes.

The child's PYTHONPATH is that folder and this checkout; its TMPDIR and pytest's basetemp
live under the calling test's ``tmp_path``; ``--timeout`` bounds each test, so one that
hangs fails alone instead of the whole run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = ROOT / "tests" / "compat" / "joblib_suite"
DOC = ROOT / "docs" / "joblib.md"


def run_suite(
    tmp_path: Path,
    rootdir: Path,
    targets: list[str],
    plugins: list[str],
    env: dict[str, str],
    timeout_s: float,
    per_test_s: int = 120,
) -> dict[str, dict[str, Any]]:
    """Runs pytest on ``targets`` with ``plugins`` (and suite_report) and the environment
    plus ``env``; returns node id -> {"outcome", "detail", "kind"}, the ids relative to
    ``rootdir`` (the peer's package, whose conftest.py runs).  Fails the calling test, with
    the child's output, when the child wrote no report.

    The child reads an empty ini file: found by itself, pytest would take this checkout's
    pyproject.toml where the venv lives inside the checkout (``--strict-markers`` then
    refuses joblib's markers, which its own repository registers)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join((str(PLUGIN_DIR), str(ROOT)))
    child_env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    report = tmp_path / "report.json"
    child_env["FASTPOOL_JOBLIB_REPORT"] = str(report)
    child_env.update(env)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    for plugin in ("suite_report", *plugins):
        cmd += ["-p", plugin]
    cmd += [f"--timeout={per_test_s}", "-W", "ignore::pytest.PytestUnknownMarkWarning"]
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    cmd += ["-c", str(ini), f"--rootdir={rootdir}", f"--basetemp={tmp_path / 'base'}", *targets]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=timeout_s
    )
    assert report.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(report.read_text())


def count(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """kind -> outcome -> how many."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows.values():
        kind = counts.setdefault(row["kind"], {})
        kind[row["outcome"]] = kind.get(row["outcome"], 0) + 1
    return counts


def undocumented(expected_failures: dict[str, str]) -> list[str]:
    """The expected failures whose test name is not a row of docs/joblib.md."""
    doc = DOC.read_text()
    return [key for key in expected_failures if f"`{key.split('[')[0]}`" not in doc]
