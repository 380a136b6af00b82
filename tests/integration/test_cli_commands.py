"""``python -m fastpool ...`` run as a user runs it, in a subprocess: --version, doctor
--json --smoke, a one-scenario bench with --json, --compare of two files, --plot with and
without matplotlib, bench --user, and a source checkout that shadows the installed package.

Kept to a few seconds: the bench runs one scenario (``--workers 1 --only hop-1w``) against
one peer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import fastpool

PKG = Path(fastpool.__file__).parent
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def fastpool_cli(
    *args: str,
    cwd: Path | None = None,
    python_flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "fastpool", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_names_the_release_and_the_core() -> None:
    done = fastpool_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"fastpool {fastpool.__version__} (compiled core present")


@pytest.mark.linux
def test_doctor_json_smoke_reports_a_working_pool() -> None:
    done = fastpool_cli("doctor", "--json", "--smoke", "--workers", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    facts = json.loads(done.stdout)
    assert (
        facts["ok"]
        and facts["core"]
        and facts["kernel"] == {"memfd": "ok", "pidfd": "ok", "futex": "ok"}
    )
    assert facts["cpus"]["usable"] >= 1 and facts["template"]["now"]["method"] in ("fork", "spawn")
    smoke = facts["smoke"]
    assert "error" not in smoke and smoke["first_result_s"] > 0 and smoke["workers_left"] == []
    assert 0 < smoke["round_trip_median_s"] <= smoke["round_trip_p99_s"]


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("bench") / "run.json"
    done = fastpool_cli(
        "bench",
        "--quick",
        "--workers",
        "1",
        "--only",
        "hop-1w",
        "--peers",
        "mp",
        "--json",
        str(path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return path, done.stdout + "\n" + done.stderr


def test_bench_prints_the_table_and_writes_raw_samples(bench_json: tuple[Path, str]) -> None:
    path, output = bench_json
    assert (
        "| hop: no-op round trip, 1 worker |" in output
        and "| **geometric mean** | fastpool |" in output
    )
    assert "[2/" in output  # progress: what ran, on stderr
    assert (
        "_" in output.split("Python")[0] and "NumPy" in output and "fastpool 0" in output
    )  # footer
    data = json.loads(path.read_text())
    rows = {r["peer"]: r for r in data["results"] if r["scenario"] == "hop-1w"}
    assert set(rows) == {"fastpool", "mp.Pool"}
    # and right after each pool's first results: one round in each fresh process
    first = {r["peer"]: r for r in data["results"] if r["scenario"] == "hop-1w-first"}
    assert set(first) == {"fastpool", "mp.Pool"} and len(first["fastpool"]["rounds"]) == 2
    assert "first moments" in output
    assert len(rows["fastpool"]["samples"]) == len(rows["fastpool"]["rounds"]) * 200
    # --quick: each peer's rounds in 2 fresh processes, one median each
    assert len(rows["fastpool"]["extra"]["process_medians"]) == 2
    assert data["metadata"]["processes"] == 2
    assert data["environment"]["usable_cpus"] >= 1 and data["metadata"]["quick"] is True


def test_compare_two_files_marks_a_slower_row(bench_json: tuple[Path, str], tmp_path: Path) -> None:
    old, _ = bench_json
    data = json.loads(old.read_text())
    for r in data["results"]:
        if r["peer"] == "fastpool" and r["scenario"] == "hop-1w":
            r["rounds"] = [x * 100 for x in r["rounds"]]
    new = tmp_path / "new.json"
    new.write_text(json.dumps(data))
    done = fastpool_cli("bench", "--compare", str(old), str(new))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.endswith("1 worker / fastpool |"))
    assert line.startswith("| + |") and "| 100.00 |" in line
    assert "SOME BENCHMARKS GOT SLOWER: 1 row(s)" in done.stdout


@pytest.mark.skipif(HAS_MATPLOTLIB, reason="matplotlib is installed")
def test_plot_without_matplotlib_exits_2_naming_the_extra(tmp_path: Path) -> None:
    done = fastpool_cli("bench", "--only", "hop-1w", "--plot", str(tmp_path / "x.png"))
    assert done.returncode == 2 and "pip install 'fastpool[plot]'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "x.png").exists()


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib (fastpool[plot])")
def test_plot_writes_a_png(bench_json: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = bench_json
    png = tmp_path / "ratios.png"
    done = fastpool_cli("bench", "--compare", str(path), str(path), "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib (fastpool[plot])")
def test_plot_without_a_path_writes_to_the_temporary_directory_not_the_current_one(
    bench_json: tuple[Path, str], tmp_path: Path
) -> None:
    path, _ = bench_json
    here, temp = tmp_path / "checkout", tmp_path / "tmp"
    here.mkdir()
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(PKG.parent)}
    done = fastpool_cli("bench", "--compare", str(path), str(path), "--plot", cwd=here, env=env)
    assert done.returncode == 0, done.stderr
    assert list(here.iterdir()) == []
    (png,) = temp.glob("fastpool-bench-*.png")
    assert f"plot written to {png}" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_user_suggests_workers_and_a_chunk_size(tmp_path: Path) -> None:
    (tmp_path / "userwork.py").write_text("def cube(x):\n    return x ** 3\n")
    done = fastpool_cli(
        "bench",
        "--user",
        "userwork:cube",
        "--args",
        "range(2000)",
        "--workers",
        "1",
        "--json",
        "user.json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| serial | 1 |" in done.stdout and "Suggested: fastpool.Pool(1)" in done.stdout
    data = json.loads((tmp_path / "user.json").read_text())
    assert {r["how"] for r in data["rows"]} == {"serial", "fastpool", "mp.Pool"}


def test_bench_user_with_a_bad_name_is_a_usage_error(tmp_path: Path) -> None:
    done = fastpool_cli("bench", "--user", "no_such_module:f", "--args", "range(3)", cwd=tmp_path)
    assert done.returncode == 2 and "cannot import 'no_such_module'" in done.stderr


# ---- a checkout without its core, first on sys.path -----------------------------------------


@pytest.fixture
def bare_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The package's Python files in a source layout, no compiled core; site-packages on
    PYTHONPATH and ``python -S``, so the editable install's finder does not step in."""
    shutil.copytree(
        PKG,
        tmp_path / "fastpool",
        ignore=shutil.ignore_patterns("*.so", "*.c", "*.html", "__pycache__"),
    )
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "csrc").mkdir()
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    return tmp_path, env


def test_importing_a_bare_checkout_explains_the_shadowing(
    bare_checkout: tuple[Path, dict[str, str]],
) -> None:
    root, env = bare_checkout
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import fastpool"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fastpool was imported from the source checkout")
    assert "pip install -e ." in last


def test_doctor_reports_the_missing_core_and_the_demo_refuses_cleanly(
    bare_checkout: tuple[Path, dict[str, str]],
) -> None:
    root, env = bare_checkout
    done = fastpool_cli("doctor", "--json", cwd=root, python_flags=("-S",), env=env)
    assert done.returncode == 1, done.stderr
    facts = json.loads(done.stdout)
    assert facts["core"] is False and not facts["ok"]
    assert any(
        "compiled core" in f["what"] and "pip install -e ." in f["fix"] for f in facts["findings"]
    )
    demo = fastpool_cli("demo", cwd=root, python_flags=("-S",), env=env)
    assert (
        demo.returncode == 1 and "source checkout" in demo.stderr and "Traceback" not in demo.stderr
    )
