"""Type checking: fastpool's public API as mypy --strict sees it, and its .pyi stubs.

- user_code.py, typical user code with ``assert_type`` on what must be inferred,
  passes ``mypy --strict`` and also runs;
- user_errors.py, deliberate mistakes, gets exactly the errors its ``# E:``
  comments name, on exactly those lines;
- the stubs of the compiled modules match the built modules (mypy's stubtest),
  so a changed .pyx with a stale .pyi fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CONFIG = HERE / "mypy.ini"
COMPILED = [
    "fastpool._native._core",
    "fastpool._native._arena",
    "fastpool._native._ndarray",
    "fastpool._runtime._task",
    "fastpool._runtime._slots",
    "fastpool._runtime._dispatch",
    "fastpool._runtime._controls",
    "fastpool._runtime._serve",
]
_EXPECTED = re.compile(r"#\s*E:\s*([a-z-]+(?:,\s*[a-z-]+)*)\s*$")
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def _mypy(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(CONFIG),
            "--cache-dir",
            str(cache),
            "--no-pretty",
            "--no-error-summary",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One mypy run over both files (the numpy stubs are read once)."""
    proc = _mypy(
        str(HERE / "user_code.py"),
        str(HERE / "user_errors.py"),
        cache=tmp_path_factory.mktemp("mypy-cache"),
    )
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        pytest.fail(f"mypy itself failed (exit {proc.returncode}):\n{proc.stderr}\n{proc.stdout}")
    found: dict[str, set[tuple[int, str]]] = {"user_code.py": set(), "user_errors.py": set()}
    for line in proc.stdout.splitlines():
        m = _ERROR.match(line)
        if m:
            found.setdefault(Path(m["file"]).name, set()).add((int(m["line"]), m["code"]))
    return {"found": found, "stdout": proc.stdout}


@pytest.mark.slow
def test_typical_user_code_passes_mypy_strict(mypy_run: dict[str, Any]) -> None:
    assert mypy_run["found"]["user_code.py"] == set(), mypy_run["stdout"]


@pytest.mark.slow
def test_each_deliberate_mistake_is_reported_on_its_line(mypy_run: dict[str, Any]) -> None:
    expected = set()
    for n, text in enumerate((HERE / "user_errors.py").read_text().splitlines(), 1):
        if m := _EXPECTED.search(text):
            expected |= {(n, code.strip()) for code in m[1].split(",")}
    assert len(expected) >= 20  # the comments were read
    found = mypy_run["found"]["user_errors.py"]
    assert sorted(expected - found) == [], f"not reported:\n{mypy_run['stdout']}"
    assert sorted(found - expected) == [], f"reported, not expected:\n{mypy_run['stdout']}"


def test_typical_user_code_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "user_code.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_stubs_match_the_compiled_modules(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            *COMPILED,
            "--mypy-config-file",
            str(HERE / "stubtest.ini"),
            "--allowlist",
            str(HERE / "stubtest_allowlist.txt"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
