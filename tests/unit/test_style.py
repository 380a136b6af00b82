"""Style is checked, not remembered: ruff's lint and format over the Python sources
(the rules are in pyproject.toml), and the same 100-character line limit over the C and
Cython sources, which ruff does not read."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_TREES = ["fastpool", "tests", "benchmarks", "setup.py"]
LINE_LIMIT = 100  # pyproject.toml [tool.ruff] line-length


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("ruff is not installed: it is in the test extra (pip install -e '.[test]')")
    return subprocess.run(
        [exe, *args, *PYTHON_TREES], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_finds_nothing_to_lint() -> None:
    done = _ruff("check", "--no-cache", "--output-format", "concise")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_python_sources_are_formatted() -> None:
    done = _ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def _native_sources() -> list[Path]:
    found = [*ROOT.glob("csrc/*.h"), *ROOT.glob("tests/native/*.[ch]")]
    found += [p for p in (ROOT / "fastpool").rglob("*") if p.suffix in (".pyx", ".pxd")]
    return sorted(found)


def long_lines(paths: list[Path], limit: int = LINE_LIMIT) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{n}: {len(line)} characters"
        for path in paths
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > limit
    ]


def test_c_and_cython_lines_fit_the_limit() -> None:
    paths = _native_sources()
    assert {p.suffix for p in paths} >= {".h", ".c", ".pyx", ".pxd"}  # the globs found them
    assert long_lines(paths) == []


def test_a_long_line_is_caught(tmp_path: Path) -> None:
    src = tmp_path / "x.pyx"
    src.write_text("ok\n" + "x" * (LINE_LIMIT + 1) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules[__name__], "ROOT", tmp_path)
        assert long_lines([src]) == [f"x.pyx:2: {LINE_LIMIT + 1} characters"]
