"""The CLI's pure parts, in one process: command-line detection, the missing-core advice,
the bench report (ratios, geometric means, instability, compare, JSON), --user helpers,
doctor's template prediction, and the demo's chunked job.

The commands themselves run in tests/integration/test_cli_commands.py.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest

from fastpool._bench import report, scenarios, user
from fastpool._bench.runner import Result
from fastpool._runtime import _install
from fastpool.cli import demo, doctor
from fastpool.errors import WorkerCrashed

# ---- python -m fastpool, as the interpreter saw it -------------------------------------


@pytest.mark.parametrize(
    "orig",
    [
        ["python", "-m", "fastpool", "doctor"],
        ["python", "-mfastpool"],
        ["python", "-P", "-m", "fastpool"],
        ["python", "-Pm", "fastpool"],
        ["python", "-X", "dev", "-W", "error", "-m", "fastpool", "demo"],
        ["python", "-Xfrozen_modules=off", "-m", "fastpool"],
    ],
)
def test_python_dash_m_fastpool_is_recognised(orig: list[str]) -> None:
    assert _install.launched_as_cli(["-m"], orig)


@pytest.mark.parametrize(
    "argv, orig",
    [
        (["-m"], ["python", "-m", "pytest", "tests"]),  # another package imports fastpool
        (["-m"], ["python", "-m", "fastpool.cli"]),
        (["-c"], ["python", "-c", "import fastpool"]),
        (["script.py"], ["python", "script.py", "-m", "fastpool"]),
        (["-m"], ["python", "-c", "x", "-m", "fastpool"]),  # -c ends the options
        (["-m"], ["python", "-X", "m", "-m", "other"]),  # -X's value is no option cluster
    ],
)
def test_other_command_lines_are_not_the_cli(argv: list[str], orig: list[str]) -> None:
    assert not _install.launched_as_cli(argv, orig)


# ---- the missing core ---------------------------------------------------------------------


def _checkout(root: Path) -> Path:
    pkg = root / "fastpool"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (root / "setup.py").write_text("")
    (root / "csrc").mkdir()
    return pkg


def test_a_shadowing_checkout_names_both_copies_and_the_fixes(tmp_path: Path) -> None:
    pkg = _checkout(tmp_path / "src")
    installed = _installed(tmp_path / "site")
    text = _install.core_missing_message(
        ImportError("no _core"), pkg, [str(tmp_path / "src"), str(tmp_path / "site")], []
    )
    assert str(tmp_path / "src") in text and str(installed) in text
    assert "shadows" in text and "pip install -e ." in text and "PYTHONSAFEPATH=1" in text


def _installed(where: Path) -> Path:
    """A fastpool/ with a compiled core (an empty file named as one) in ``where``."""
    pkg = where / "fastpool"
    (pkg / "_native").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_native" / "_core.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    return pkg


class _EditableFinder:
    """What setuptools' editable install of a flat layout adds: a finder after the path
    scan, and no entry on sys.path."""

    def __init__(self, pkg: Path) -> None:
        self.pkg = pkg

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        import importlib.util

        if name != "fastpool":
            return None
        init = self.pkg / "__init__.py"
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(self.pkg)]
        )


def test_a_shadowing_checkout_names_an_editable_install_that_a_finder_serves(
    tmp_path: Path,
) -> None:
    """Issue 32: with the installed copy behind an import hook (an editable install), the
    message said that no installed fastpool was found on sys.path."""
    pkg = _checkout(tmp_path / "src")
    installed = _installed(tmp_path / "other-checkout")
    finder = _EditableFinder(installed)
    text = _install.core_missing_message(
        ImportError("no _core"), pkg, [str(tmp_path / "src")], [finder]
    )
    assert str(installed) in text and "shadows" in text, text


def test_a_checkout_with_nothing_installed_says_to_build_it(tmp_path: Path) -> None:
    pkg = _checkout(tmp_path)
    text = _install.core_missing_message(ImportError("no _core"), pkg, [str(tmp_path)], [])
    assert "no installed fastpool" in text and "pip install -e ." in text and "shadows" not in text


def test_a_core_that_fails_to_load_is_blamed_on_the_build(tmp_path: Path) -> None:
    pkg = _checkout(tmp_path)
    (pkg / "_native").mkdir()
    (pkg / "_native" / "_core.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    text = _install.core_missing_message(ImportError("undefined symbol: fp_x"), pkg, [])
    assert (
        "failed to load" in text
        and "undefined symbol: fp_x" in text
        and "--force-reinstall" in text
    )


def test_an_installed_package_without_core_says_to_reinstall(tmp_path: Path) -> None:
    pkg = tmp_path / "site-packages" / "fastpool"
    pkg.mkdir(parents=True)
    text = _install.core_missing_message(ImportError("no _core"), pkg, [])
    assert "pip install --force-reinstall --no-cache-dir fastpool" in text


# ---- the bench report ---------------------------------------------------------------------


def _result(
    scenario: str,
    peer: str,
    rounds: list[float],
    variant: str = "",
    idiom: bool = False,
    samples: list[float] | None = None,
) -> Result:
    return Result(
        scenario,
        f"group {scenario}",
        peer,
        variant,
        idiom,
        2,
        "rounds",
        "calls/s",
        1.0,
        rounds=rounds,
        samples=samples or [],
    )


RESULTS = [
    _result("a", "mp.Pool", [4.0, 4.0, 4.0]),
    _result("a", "fastpool", [1.0, 1.0, 1.0]),
    _result("a", "fastpool", [2.0, 2.0, 2.0], variant="share", idiom=True),
    _result("b", "mp.Pool", [1.0, 1.0, 1.0]),
    _result("b", "fastpool", [1.0, 1.0, 1.0], variant="chunksize=10"),
    _result("b", "fastpool", [0.25, 0.25, 0.25], variant="chunksize=100"),
    _result("b", "loky", [2.0, 2.0, 2.0]),
]


def test_a_swept_setting_keeps_its_fastest_row_and_an_idiom_keeps_its_own() -> None:
    rows = {(r.scenario, r.label): r for r in report.best_rows(RESULTS)}
    assert rows[("b", "fastpool")].variant == "chunksize=100"
    assert ("a", "fastpool [share]") in rows and rows[("a", "fastpool")].median == 1.0


def test_ratios_are_mp_pool_time_over_the_rows_and_the_geomean_takes_plain_rows() -> None:
    ratio = report.ratios(RESULTS)
    assert ratio[("a", "fastpool")] == 4.0 and ratio[("a", "fastpool [share]")] == 2.0
    assert ratio[("b", "loky")] == 0.5
    means = report.geomeans(RESULTS)
    assert means["fastpool"] == (pytest.approx(4.0), 2)  # sqrt(4 * 4); [share] left out
    assert means["loky"] == (pytest.approx(0.5), 1) and "mp.Pool" not in means
    text = report.table(RESULTS)
    assert "| **geometric mean** | fastpool | 2 scenarios |" in text and "4.00x" in text


def test_a_row_whose_rounds_spread_over_ten_percent_is_flagged() -> None:
    steady = _result("s", "fastpool", [1.0, 1.0, 1.05])
    shaky = _result("s", "mp.Pool", [1.0, 1.5, 0.7])
    assert report.unstable([steady]) == []
    warning = report.unstable([steady, shaky])
    assert (
        len(warning) == 1
        and "1 of 2 figures are unstable" in warning[0]
        and "mp.Pool" in warning[0]
    )
    rows = {
        line.split("|")[2].strip(): line for line in report.table([steady, shaky]).splitlines()[2:]
    }
    assert "!" in rows["mp.Pool"] and "!" not in rows["**fastpool**"]


def test_a_round_of_short_calls_follows_a_rounds_worth_of_warm_up_and_is_sized_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastpool._bench import runner

    clock = [0.0]
    # a cold first call, a spell of slow ones (an idle vCPU waking), then warm ones
    durations = iter([5e-3] + [2e-3] * 6 + [3e-4] * 10_000)

    def call() -> int:
        clock[0] += next(durations)
        return 1

    # runner's own clock, not the time module's: other threads keep the real one
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    case = scenarios.Case("s", "g", "fastpool", build=lambda peer: call, rounds=2)
    peer = type("Peer", (), {"start_method": "fork"})()
    result = runner.measure(case, peer)
    # sized by the first call: rounds of 4; by the first five after it: 10, timed in the spell
    assert result.extra["calls_per_round"] == runner.MAX_INNER
    assert result.rounds == pytest.approx([3e-4, 3e-4])


def test_p99_comes_from_every_call_of_a_latency_row() -> None:
    r = _result("h", "fastpool", [1e-5], samples=[1e-5] * 99 + [1e-3])
    assert r.p99 == 1e-3 and report.fmt_time(r.p99) == "1.00 ms"


def test_json_round_trips_and_compare_marks_what_changed(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    report.dump(RESULTS, {"fastpool": "0"}, {"quick": True}, str(path))
    old, doc = report.load(str(path))
    assert doc["environment"] == {"fastpool": "0"} and [r.rounds for r in old] == [
        r.rounds for r in RESULTS
    ]
    new = [
        _result(
            r.scenario,
            r.peer,
            [x * (3 if r.peer == "loky" else 1) for x in r.rounds],
            r.variant,
            r.idiom,
        )
        for r in RESULTS
    ]
    text = report.compare(old, new)
    loky = next(line for line in text.splitlines() if line.endswith("group b / loky |"))
    assert loky.startswith("| + |") and "| 3.00 |" in loky
    assert "SOME BENCHMARKS GOT SLOWER: 1 row(s)" in text


def test_compare_calls_a_change_within_the_rounds_spread_noise() -> None:
    before = [_result("n", "fastpool", [1.0, 1.0, 2.0])]
    after = [_result("n", "fastpool", [1.5, 1.5, 1.5])]  # median x1.5, inside the old rounds' range
    text = report.compare(before, after)
    assert any(line.startswith("| ~ |") for line in text.splitlines())
    assert "noise, not a change" in text and "GOT SLOWER" not in text


def test_a_file_that_is_not_a_bench_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pytest-benchmark.json"
    path.write_text(json.dumps({"benchmarks": []}))
    with pytest.raises(ValueError, match="not a `python -m fastpool bench --json` file"):
        report.load(str(path))


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"pip install 'fastpool\[plot\]'"):
        report.require_matplotlib()


def test_quick_catalogue_leaves_out_256_mib_and_only_filters_by_id() -> None:
    quick = scenarios.catalog(["fastpool", "mp.Pool", "joblib"], quick=True)
    assert not any(c.extra.get("mib") == 256 for c in quick)
    assert not any(c.scenario.startswith("hop-1w") for c in quick)  # the run's size only
    assert {c.peer for c in quick if c.scenario == "hop-2w"} == {
        "fastpool",
        "mp.Pool",
    }  # joblib: arrays only
    assert {c.peer for c in quick if c.scenario.startswith("arrays")} >= {
        "joblib",
        scenarios.IN_PROCESS,
    }
    only = scenarios.catalog(["fastpool"], quick=True, section="quiet", only="hop-2w,start")
    assert {c.scenario for c in only} == {"hop-2w", "hop-2w-first", "start"}


# ---- --user -------------------------------------------------------------------------------


def test_user_inputs_from_an_expression_or_a_name() -> None:
    assert user.inputs("range(3)") == [0, 1, 2]
    assert len(user.inputs("np.arange(6).reshape(3, 2)")) == 3
    assert user.inputs("json:loads.__name__") == list("loads")  # MODULE:NAME of a sequence
    with pytest.raises(user.UsageError, match="failed: NameError"):
        user.inputs("nonsense_name")
    with pytest.raises(user.UsageError, match="several"):
        user.inputs("[1]")
    with pytest.raises(user.UsageError, match="MODULE:NAME"):
        user.resolve("not a name")


def test_chunk_candidates_aim_at_ten_ms_a_chunk() -> None:
    assert user.chunk_candidates(1e-6, 100_000, 2) == [
        2500,
        10_000,
        40_000,
    ]  # 1 call alone is all hop
    assert user.chunk_candidates(5e-3, 100, 2) == [1, 2, 8]  # aim 2: x 1/4, 1, 4
    assert max(user.chunk_candidates(1e-7, 1000, 2)) <= 500  # never over n / workers


def test_results_compare_arrays_and_nans() -> None:
    assert user.same((np.array([1.0, np.nan]), 2), (np.array([1.0, np.nan]), 2))
    assert not user.same(np.array([1.0]), np.array([1.0 + 1e-16 * 4]))
    assert user.same(float("nan"), float("nan")) and not user.same(1, 2)


# ---- doctor and demo ----------------------------------------------------------------------


def test_doctor_predicts_spawn_for_a_threaded_process_and_honours_the_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastpool._runtime import _forksafe

    monkeypatch.delenv("FASTPOOL_TEMPLATE_START", raising=False)
    monkeypatch.setattr(_forksafe, "rss_bytes", lambda: 50 << 20)
    monkeypatch.setattr(_forksafe, "fork_candidate", lambda libs=None: True)
    assert doctor.template_plan()["method"] == "fork"
    monkeypatch.setattr(_forksafe, "fork_candidate", lambda libs=None: False)
    plan = doctor.template_plan()
    assert plan["method"] == "spawn" and "other threads" in plan["why"]
    monkeypatch.setattr(_forksafe, "fork_candidate", lambda libs=None: True)
    monkeypatch.setattr(_forksafe, "rss_bytes", lambda: 1 << 30)
    assert "1024 MiB resident" in doctor.template_plan()["why"]
    monkeypatch.setenv("FASTPOOL_TEMPLATE_START", "spawn")
    assert doctor.template_plan() == {"method": "spawn", "why": "FASTPOOL_TEMPLATE_START=spawn"}


@pytest.mark.linux
def test_doctor_finds_the_kernel_features_fastpool_uses() -> None:
    assert doctor.kernel_features() == {"memfd": "ok", "pidfd": "ok", "futex": "ok"}


def test_the_demo_job_gives_the_same_bits_whole_or_in_chunks() -> None:
    x = np.random.default_rng(1).random(10_007)
    out = np.empty_like(x)
    bounds = [(0, 3333), (3333, 7001), (7001, x.size)]
    assert sum(demo.job_fill(x, out, lo, hi) for lo, hi in bounds) == x.size
    whole = demo.job_chunk(x)
    assert np.array_equal(out, whole)
    assert np.array_equal(np.concatenate([demo.job_chunk(x[lo:hi]) for lo, hi in bounds]), whole)
    assert math.isclose(whole[5], math.sqrt(x[5]) * 0.5 + x[5])


def test_the_commands_are_leaves_that_nothing_in_the_library_imports() -> None:
    import ast

    pkg = Path(_install.__file__).parent
    for path in pkg.glob("*.py"):
        if path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.startswith(("fastpool.cli", "fastpool._bench")) for n in names), (
                path.name
            )
    # and _install, which __init__ runs before anything else loads, needs only the standard library
    tree = ast.parse((pkg / "_install.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m.split(".")[0] for m in imported} <= set(__import__("sys").stdlib_module_names) | {
        "__future__"
    }


def test_the_catalogue_has_every_row_of_issue_16() -> None:
    cases = scenarios.catalog(["fastpool", "mp.Pool", "PPE"])
    rows = {(c.scenario, c.label) for c in cases}
    for peer in ("fastpool", "mp.Pool", "PPE"):
        assert {("hop-2w", peer), ("submits", peer), ("start", peer), ("burst", peer)} <= rows
        assert any(s == "map" and p == peer and not c.idiom for (s, p), c in _by(cases).items())
    assert {("map", "fastpool [default chunksize]"), ("map", "mp.Pool [default chunksize]")} <= rows
    for direction in ("one-way", "round-trip"):
        assert {
            (f"arrays-{direction}-256", "in-process"),
            (f"arrays-{direction}-256", "fastpool"),
            (f"arrays-{direction}-256", "fastpool [share]"),
        } <= rows
    assert ("import", "fastpool") in rows
    burst = next(c for c in cases if c.scenario == "burst")
    assert (burst.workers, scenarios.BURST_TASKS, scenarios.BURST_TASK_S) == (4, 40, 0.1)
    hop = next(c for c in cases if c.scenario == "hop-2w")
    assert hop.rounds >= 10 and all(c.fresh is not None for c in cases if c.kind == "fresh")


def _by(cases: list) -> dict:
    return {(c.scenario, c.label): c for c in cases}


def test_the_table_shows_the_spread_of_the_per_process_medians() -> None:
    bimodal = _result("h", "fastpool", [3e-6, 3e-6, 150e-6])
    bimodal.extra["process_medians"] = [3e-6, 3e-6, 150e-6]
    single = _result("h", "mp.Pool", [30e-6])
    single.extra["process_medians"] = [30e-6]
    rows = {
        line.split("|")[2].strip(): line for line in report.table([bimodal, single]).split("\n")
    }
    assert "| 3.00 µs / 3.00 µs / 150 µs (3) |" in rows["**fastpool**"]
    assert "(1)" not in rows["mp.Pool"]  # one process: no spread to show


def test_the_bench_warns_when_fresh_processes_would_compile_fastpool(monkeypatch) -> None:
    import importlib.util
    import sys

    from fastpool._bench import env

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(importlib.util, "cache_from_source", lambda src: src + ".absent.pyc")
    warning = env.bytecode_warning()
    assert warning is not None and "compileall" in warning and "__init__.py" in warning
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert env.bytecode_warning() is None  # a fresh process writes its own .pyc


def _load(avg: float, others: int | None) -> dict:
    return {"loadavg": (avg, avg, avg), "runnable_others": others, "usable_cpus": 2}


def test_the_regime_is_busy_when_the_load_or_the_runnable_processes_exceed_half_the_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastpool._bench import env

    for avg, running, want in ((0.2, 1, "quiet"), (1.3, 1, "busy"), (0.2, 4, "busy")):
        monkeypatch.setattr(env.os, "getloadavg", lambda avg=avg: (avg, 0.5, 0.25))
        monkeypatch.setattr(env, "procs_running", lambda running=running: running)
        load = env.machine_load(usable=2)
        assert load["regime"] == want, (avg, running)
        assert load["runnable_others"] == running - 1  # the reader is not another program
    assert env.describe_load(load) == (
        "load average 0.20 / 0.50 / 0.25, 3 other runnable processes, on 2 usable CPUs: busy"
    )


@pytest.mark.linux
def test_procs_running_is_read_from_proc_stat() -> None:
    from fastpool._bench import env

    running = env.procs_running()
    assert isinstance(running, int) and running >= 1  # this process is running


def test_the_demo_names_its_regime_from_the_load_at_both_ends() -> None:
    quiet = {**_load(0.1, 0), "regime": "quiet"}
    busy = {**_load(3.3, 4), "regime": "busy"}
    regime, lines = demo.regime_report(quiet, quiet)
    assert regime == "quiet" and "load average 0.10 / 0.10 / 0.10" in lines[0]
    assert not any("other programs shared" in line for line in lines)
    regime, lines = demo.regime_report(quiet, busy)
    assert regime == "busy" and "4 other runnable processes" in lines[1]
    assert any("this load's, not a quiet machine's" in line for line in lines)


def test_the_demos_sigkill_line_names_the_task_as_the_sender_not_the_oom_killer() -> None:
    """Issue 32: the demo's SIGKILL line blamed "often the kernel's OOM killer" for a kill
    its own task sent."""
    line = demo.said(WorkerCrashed(0, 123, -9, 7))
    assert "OOM" not in line and "the task sent it to its own worker" in line, line
    assert "died of SIGKILL while running task 7" in line
