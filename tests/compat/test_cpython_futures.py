"""CPython's own ``test.test_concurrent_futures`` suites against ``fastpool.Pool``.

Runs tests/compat/cpython_futures.py twice where it can:

- under a CPython 3.13 that ships its ``test`` package (pyenv's does; set FASTPOOL_CPYTHON to
  another interpreter), with this checkout built for it in a cached virtualenv keyed by the
  hash of the sources (the first build takes about a minute; a warm run about 40 s);
- under the interpreter running this suite, when it is 3.14 or later and has its ``test``
  package (tools/pythonsid.sh makes such a 3.14 and 3.15, with Debian's
  libpython3.1X-testsuite), on this checkout as it is built in place.

Every test must pass, be skipped with a reason, or fail as listed in the adapter's
EXPECTED_FAILURES (mirrored in docs/migrating.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = Path(__file__).with_name("cpython_futures.py")
SOURCES = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "fastpool", "csrc")
DEPENDENCIES = ("numpy", "psutil", "cloudpickle", "threadpoolctl", "Cython", "setuptools>=77")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _interpreter() -> str | None:
    candidates = [os.environ.get("FASTPOOL_CPYTHON")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")))
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.13*/bin/python3.13"))
    candidates.append(shutil.which("python3.13"))
    for exe in filter(None, candidates):
        if _has_test_package(exe):
            return exe
    return None


def _source_hash() -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        path = ROOT / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.is_file() and f.suffix not in (".so", ".c", ".pyc", ".html"):
                h.update(str(f.relative_to(ROOT)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _venv(python: str) -> Path:
    """A virtualenv of ``python`` with this checkout installed (not editable), built once
    per source hash under FASTPOOL_COMPAT_CACHE (default: the temp dir)."""
    cache = Path(os.environ.get("FASTPOOL_COMPAT_CACHE", tempfile.gettempdir()))
    venv = cache / f"fastpool-cpython313-{_source_hash()}"
    with _locked(cache / "fastpool-cpython313.lock"):
        if (venv / "ready").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        for old in cache.glob("fastpool-cpython313-*"):  # earlier sources: one build kept
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run(pip + list(DEPENDENCIES), check=True)
        with tempfile.TemporaryDirectory() as tmp:  # a copy: no build/ left in the checkout
            for name in SOURCES:
                src = ROOT / name
                if src.is_dir():
                    shutil.copytree(
                        src, Path(tmp) / name, ignore=shutil.ignore_patterns("*.so", "*.c")
                    )
                elif src.exists():
                    shutil.copy(src, Path(tmp) / name)
            subprocess.run(pip + ["--no-build-isolation", "--no-deps", tmp], check=True)
        (venv / "ready").touch()
    return venv


def _has_test_package(exe: str) -> bool:
    probe = [exe, "-c", "import test.test_concurrent_futures.test_deadlock"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _run_adapter(python: str, env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "outcomes.json"
    proc = subprocess.run(
        [python, str(ADAPTER), "--json", str(out)],
        cwd=tmp_path,  # not the checkout: its fastpool/ would shadow the installed one
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), proc.stderr[-4000:]
    report = json.loads(out.read_text())
    counts = report["counts"]
    print(json.dumps(counts), file=sys.stderr)
    bad = {
        k: v
        for k, v in report["outcomes"].items()
        if v[0] not in ("passed", "skipped", "expected failure")
    }
    assert not bad, "\n\n".join(f"{k}: {o}\n{detail}" for k, (o, detail) in bad.items())
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert counts["passed"] >= 35  # the suites really ran


def cpython_venv() -> tuple[str, dict[str, str]]:
    """The CPython 3.13 virtualenv's interpreter with this checkout installed, and the
    environment to run an adapter in (none of our PYTHON* variables); skips the test where
    no CPython 3.13 with its ``test`` package is found."""
    python = _interpreter()
    if python is None:
        pytest.skip(
            "no CPython 3.13 with its test package (test.test_concurrent_futures) was found; "
            "install one with pyenv or point FASTPOOL_CPYTHON at it"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return str(_venv(python) / "bin" / "python"), env


def test_cpython_executor_suites_pass_or_fail_as_listed(tmp_path: Path) -> None:
    _run_adapter(*cpython_venv(), tmp_path)


@pytest.mark.peer_suite  # .ci/pythonsid runs the adapter itself, after that Python's suite
def test_this_interpreters_executor_suites_pass_or_fail_as_listed(tmp_path: Path) -> None:
    """3.14's or 3.15's own suites, when this suite runs under it (tools/pythonsid.sh)."""
    if sys.version_info < (3, 14):
        pytest.skip(f"runs under Python 3.14 or later (this is {sys.version.split()[0]})")
    if not _has_test_package(sys.executable):
        pytest.skip(f"{sys.executable} has no test.test_concurrent_futures package")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout, as built in place for this interpreter
    _run_adapter(sys.executable, env, tmp_path)
