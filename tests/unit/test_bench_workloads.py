"""The bench's workloads section runs every workload on every installed library at tiny
sizes and leaves no process behind; a library that raises shows as "fails: <exception>"
and one not installed as "not installed", rows of the table, never a stop or a bench
failure. No test reads a time as a pass or a fail."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import psutil
import pytest

from fastpool._bench import runner, scenarios, workloads
from fastpool._bench import workload_libs as libs
from fastpool._bench.runner import Result

pytestmark = [pytest.mark.linux, pytest.mark.slow]


def _installed() -> list[str]:
    return [n for n in libs.LIBRARIES if not libs.missing(n, "long")]


def _new_processes(before: set[int]) -> list[str]:
    """This session is a child subreaper (conftest): what a library leaves running, even
    orphaned (a Ray raylet, a Dask nanny), comes back here."""
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    # An orphan handed to this session may be exiting, or have exited and wait for its
    # reaping (a zombie: read under two CPU hogs as '9448 ', a loky worker that outlived
    # its trial's process): reaped here, it was not left running.
    _, alive = psutil.wait_procs(new, timeout=10)
    out = []
    for p in alive:
        try:
            out.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return out


# one workload of each of a library's methods (workload_libs.Library): map with a length
# and from a generator, map_arg, state, init, grid; the other workloads are maps too. Ray
# takes seconds a process to start: every workload on every library is minutes here.
TEST_WORKLOADS = ("long", "long-gen", "argument", "state", "init", "gridsearch")


@pytest.mark.parametrize("library", [*libs.LIBRARIES, workloads.IDEAL])
def test_every_method_runs_on_every_installed_library_and_leaves_no_process(
    library: str,
) -> None:
    all_cases = workloads.cases("tiny")
    assert {c.scenario for c in all_cases} == {workloads.PREFIX + w for w in libs.WORKLOADS}
    cases = [c for c in all_cases if c.extra["workload"] in TEST_WORKLOADS and c.peer == library]
    assert cases
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    results = runner.run(cases)
    for r in results:
        if r.peer in libs.LIBRARIES and libs.missing(r.peer, r.extra["workload"]):
            assert workloads.cell(r) == "not installed", r.error
        elif r.error:  # a library's own failure is a result, shown as such
            assert workloads.cell(r).startswith("fails: "), (r.group, r.peer, r.error)
        else:
            assert len(r.rounds) == 1, (r.group, r.peer)
    if library == workloads.IDEAL or library in _installed():
        assert any(r.rounds for r in results), [r.error for r in results]
    if library == "fastpool.Pool":  # fastpool's own rows run every method at these sizes
        assert all(r.rounds for r in results), [r.error for r in results]
    assert workloads.failures(results) == []
    text = workloads.table(results)
    assert "x best library" in text and library in text
    assert _new_processes(before) == []


def test_a_library_that_raises_is_reported_as_failing_not_as_a_bench_failure() -> None:
    # multiprocessing.Pool cannot pickle a function defined inside another: it raises, and
    # the row says which exception, while the run goes on and the bench does not fail
    cases = [
        c
        for c in workloads.cases("tiny")
        if c.scenario == "workload-closure" and c.peer == "mp.Pool"
    ]
    (result,) = runner.run(cases)
    assert result.error and result.error.startswith("WorkloadFailed"), result.error
    cell = workloads.cell(result)
    assert cell.startswith("fails: ") and cell != "fails: WorkloadFailed", cell
    assert cell in workloads.table([result])
    assert workloads.failures([result]) == []


def test_a_library_not_installed_is_a_row_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libs, "missing", lambda library, workload: "ray is not installed")
    cases = [c for c in workloads.cases("tiny") if c.peer == "Ray" and c.scenario.endswith("long")]
    (result,) = runner.run(cases)
    assert workloads.cell(result) == "not installed"
    assert "not installed" in workloads.table([result])
    assert workloads.failures([result]) == []


def test_a_bare_folder_named_like_a_library_is_not_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray leaves /tmp/ray behind; a bench run from /tmp found it as a namespace package
    (tmp_path / "ray").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    if importlib.util.find_spec("ray").origin not in (None, "namespace"):
        pytest.skip("Ray is installed: the real package wins over the folder")
    assert libs.missing("Ray", "long") == "ray is not installed (pip install 'fastpool[bench]')"


def test_the_ideal_spreads_the_tasks_over_the_workers_and_adds_what_each_pays_once() -> None:
    parts = {"tasks": [0.1] * 10 + [0.5], "fixed": 0.25, "copy": 0.01}
    assert workloads.ideal_s(parts, 2) == pytest.approx(0.75 + 0.25 + 0.01)
    # a task longer than the share of each worker bounds the ideal from below
    parts = {"tasks": [0.1, 0.1, 2.0], "fixed": 0.0, "copy": 0.0}
    assert workloads.ideal_s(parts, 2) == pytest.approx(2.0)


def test_the_section_is_selectable_and_all_keeps_every_section() -> None:
    only = scenarios.catalog(["fastpool"], quick=True, section="workloads")
    assert only and all(workloads.is_workload(c.scenario) for c in only)
    every = {c.scenario for c in scenarios.catalog(["fastpool"], section="all", batch_mib=32)}
    assert any(s.startswith("contention-") for s in every)
    assert any(workloads.is_workload(s) for s in every)
    assert {"hop-1w", "hop-1w-first", "submits", "submits-first"} <= every


def test_a_row_that_did_not_run_shows_why() -> None:
    r = Result("workload-long", "g", "Ray", "", False, 2, "fresh", "calls/s", 1.0)
    r.error = "RuntimeError: workload process failed (1)"
    assert workloads.cell(r) == "error: RuntimeError"
    assert workloads.failures([r]) == [r]
