"""The bench's contention section runs and cleans up: the hogs it starts are ended by pid
(also when the row fails), every contention, idle and memory row runs at tiny sizes on
fastpool and multiprocessing.Pool, and the report shows value rows in their units without
mixing them into the speed geomeans. No test reads a time as a pass or a fail."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

import fastpool
from fastpool._bench import contention, load, report, runner, scenarios
from fastpool._bench.runner import Result

pytestmark = pytest.mark.linux


def _hogs_left(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_hogs_are_spinning_inside_and_ended_by_pid_after() -> None:
    with load.hogs(2) as pids:
        assert len(pids) == 2 and _hogs_left(pids) == pids
        assert all("while True" in " ".join(psutil.Process(p).cmdline()) for p in pids)
    assert _hogs_left(pids) == []


def test_hogs_are_ended_when_the_row_under_them_fails() -> None:
    seen: list[int] = []
    with pytest.raises(RuntimeError, match="the row failed"), load.hogs(1) as pids:
        seen += pids
        raise RuntimeError("the row failed")
    assert seen and _hogs_left(seen) == []


def test_three_programs_leave_nothing_of_theirs_behind_not_even_an_orphan() -> None:
    """Each program's pool starts servers that outlive the program by moments (3.14's
    forkserver and resource tracker under mp.Pool): the row waits for them by pid. This
    session is a child subreaper (conftest), so an orphan comes back here, running or a
    zombie; either is a leftover.  Under 3.11 mp.Pool forks and starts no server."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    medians = load.programs_at_once("mp.Pool", 3, 2, 0.05)
    assert len(medians) == 3
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert [p.pid for p in new] == []


def test_every_contention_row_runs_at_tiny_sizes_and_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiny = {**contention.QUICK, "calls": 5, "rounds": 1, "program_s": 0.05, "spin_tasks": 4}
    monkeypatch.setattr(contention, "QUICK", {**tiny, "idle_window_s": 0.05})
    monkeypatch.setattr(contention, "IDLE_WORKERS", (2,))
    monkeypatch.setattr(contention, "IDLE_SETTLE_S", 0.0)
    monkeypatch.setattr(contention, "BATCH_SETTLE_S", 0.0)
    cases = scenarios.catalog(
        ["fastpool", "mp.Pool"], quick=True, section="contention", batch_mib=32
    )
    ids = {c.scenario for c in cases}
    assert ids == {
        "contention-hogs",
        "contention-programs",
        "contention-oversub",
        "contention-spin-map",
        "contention-idle-2",
        "contention-batch-peak",
        "contention-batch-held",
    }
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    results = runner.run(cases)
    assert [r.error for r in results if r.error] == []
    assert all(r.rounds for r in results)
    held = [r for r in results if r.scenario == "contention-batch-held"]
    assert all("peak_mib" in r.extra["per_round"] for r in held)  # the peak row's own batch
    idle = next(r for r in results if r.scenario == "contention-idle-2")
    assert idle.median >= 0 and set(idle.extra["per_round"]) == {"parent", "workers"}
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and _running_but_the_template(p)
    ]
    assert left == []
    table = report.table(results)
    assert "CPU hogs running" in table and " MiB |" in table and "/s |" in table


def _running_but_the_template(p: psutil.Process) -> bool:
    """A child still running that is not a server meant to live as long as this process:
    fastpool's template, or multiprocessing's forkserver and resource tracker (3.14's
    default start method starts them for the mp.Pool peer).  A zombie is not running: on
    3.14 a child that has exited may not be reaped yet, and psutil raises ZombieProcess
    for its command line."""
    servers = ("fastpool._runtime._template", "multiprocessing.forkserver", "resource_tracker")
    try:
        cmdline = " ".join(p.cmdline())
        return not any(name in cmdline for name in servers)
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False


def test_the_quiet_section_has_no_contention_row_and_all_has_both() -> None:
    quiet = scenarios.catalog(["fastpool"], quick=True, section="quiet")
    both = scenarios.catalog(["fastpool"], quick=True, section="all", batch_mib=32)
    assert not any(report.is_contention(c.scenario) for c in quiet)
    assert [c.scenario for c in both[: len(quiet)]] == [c.scenario for c in quiet]
    assert any(report.is_contention(c.scenario) for c in both[len(quiet) :])
    with pytest.raises(ValueError, match="section"):
        scenarios.catalog(["fastpool"], section="busy")


def _value(scenario: str, peer: str, values: list[float], unit: str, kind: str) -> Result:
    return Result(scenario, scenario, peer, "", False, 2, kind, "", 1.0, rounds=values,
                  value_unit=unit)  # fmt: skip


def test_value_rows_are_shown_in_their_units_and_stay_out_of_the_speed_geomeans() -> None:
    rows = [
        _value("contention-idle-2", "mp.Pool", [0.002] * 3, "CPU s/s", "value"),
        _value("contention-idle-2", "fastpool", [0.030] * 3, "CPU s/s", "value"),
        _value("contention-batch-held", "mp.Pool", [2000.0] * 3, "MiB", "value"),
        _value("contention-batch-held", "fastpool", [0.0, -1.0, 0.0], "MiB", "value"),
        _value("contention-hogs", "mp.Pool", [1e-4] * 3, "", "latency"),
        _value("contention-hogs", "fastpool", [2e-5] * 3, "", "latency"),
        _value("hop-2w", "mp.Pool", [2e-4] * 3, "", "latency"),
        _value("hop-2w", "fastpool", [4e-6] * 3, "", "latency"),
    ]
    table = report.table(rows)
    assert "30.0 ms/s" in table and "2,000 MiB" in table and "| 0 MiB |" in table
    assert ("contention-batch-held", "fastpool") not in report.ratios(rows)  # 0 MiB: no ratio
    assert report.geomeans(rows)["fastpool"] == pytest.approx((50.0, 1))
    assert report.geomeans(rows, contention=True)["fastpool"] == pytest.approx((5.0, 1))
    assert "**geometric mean, contention**" in table


def test_the_default_plot_path_is_outside_the_checkout_and_the_current_directory() -> None:
    path = Path(report.default_plot_path()).resolve()
    checkout = Path(fastpool.__file__).resolve().parent.parent
    assert not path.is_relative_to(checkout) and not path.is_relative_to(Path.cwd().resolve())
    assert path.suffix == ".png" and path.name.startswith("fastpool-bench-")
