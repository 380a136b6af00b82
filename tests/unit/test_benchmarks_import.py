"""The pytest-benchmark suite in benchmarks/ still imports and collects: it is not part of
the test run (it measures, it does not check), so a renamed helper would otherwise break it
unseen until someone benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_suite_collects() -> None:
    pytest.importorskip("pytest_benchmark", reason="the benchmarks need fastpool[bench]")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " collected" in done.stdout or "tests collected" in done.stdout, done.stdout[-2000:]
