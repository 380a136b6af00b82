"""``bench --plot``'s figure reads right at a glance: multiprocessing.Pool, the baseline, is
drawn and labelled; the in-process and spawn references are drawn unlike any pool and named as
references; every bar, however far below 1x, lies inside the axis limits with its value
written; and rows whose rounds spread beyond the threshold are marked.

The figure is read back through the gids ``report.figure`` gives its artists.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from fastpool._bench import report
from fastpool._bench.runner import Result
from fastpool._bench.scenarios import IN_PROCESS, SHARED_PAGES, SPAWN_REFERENCE

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="needs matplotlib: pip install 'fastpool[plot]'",
)

STEADY = [1.0, 1.0, 1.0]
SHAKY = [0.7, 1.0, 1.5]  # standard deviation 40% of the median, over UNSTABLE_SPREAD


def _row(
    group: str,
    peer: str,
    scale: float,
    rounds: list[float] = STEADY,
    variant: str = "",
    idiom: bool = False,
) -> Result:
    return Result(
        group,
        group,
        peer,
        variant,
        idiom,
        2,
        "rounds",
        "calls/s",
        1.0,
        rounds=[scale * t for t in rounds],
    )


# mp.Pool takes 1 s in each scenario, so a row's ratio is 1 / its time.
RESULTS = [
    _row("hop", "mp.Pool", 1.0),
    _row("hop", "fastpool", 1 / 70),
    _row("hop", "loky", 1 / 0.7, SHAKY),
    _row("arrays", "mp.Pool", 1.0, SHAKY),
    _row("arrays", "fastpool", 1 / 11),
    _row("arrays", "fastpool", 1 / 50, variant="empty", idiom=True),
    _row("arrays", IN_PROCESS, 1 / 98),
    _row("arrays", IN_PROCESS, 1 / 60, variant=SHARED_PAGES, idiom=True),
    _row("start", "mp.Pool", 1.0),
    _row("start", "fastpool", 1 / 0.19),
    _row("start", "loky", 1 / 0.06),
    _row("start", SPAWN_REFERENCE, 1 / 0.07),
]


@pytest.fixture(scope="module")
def fig() -> Any:
    import matplotlib.pyplot as plt

    figure = report.figure(RESULTS, "test")
    yield figure
    plt.close(figure)


def _by_gid(fig: Any, prefix: str) -> dict[str, Any]:
    return {a.get_gid(): a for a in fig.axes[0].findobj() if str(a.get_gid()).startswith(prefix)}


def _legend(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_the_baseline_is_drawn_in_every_scenario_and_labelled(fig: Any) -> None:
    (line,) = _by_gid(fig, "baseline").values()
    assert set(line.get_xdata()) == {1.0}
    assert set(_by_gid(fig, "mp:")) == {"mp:hop", "mp:arrays", "mp:start"}
    assert report.BASELINE_LABEL in _legend(fig) and "multiprocessing.Pool" in report.BASELINE_LABEL
    texts = _by_gid(fig, "value:")
    assert texts["value:hop:mp.Pool"].get_text() == "1.00x mp.Pool (baseline)"


def test_references_are_hatched_unfilled_and_named_as_references(fig: Any) -> None:
    refs = _by_gid(fig, "reference:")
    assert set(refs) == {
        f"reference:arrays:{IN_PROCESS}",
        f"reference:arrays:{IN_PROCESS} [{SHARED_PAGES}]",
        f"reference:start:{SPAWN_REFERENCE}",
    }
    for bar in refs.values():
        assert bar.get_hatch() and bar.get_facecolor()[3] == 0.0  # hatched, no fill
    peers = _by_gid(fig, "bar:")
    assert all(not bar.get_hatch() and bar.get_facecolor()[3] > 0 for bar in peers.values())
    assert f"bar:arrays:{IN_PROCESS}" not in peers
    assert "in-process reference, not a pool" in _legend(fig)
    assert "not a pool" in _by_gid(fig, "value:")[f"value:arrays:{IN_PROCESS}"].get_text()


def test_the_shared_pages_reference_is_no_pool_bar_and_no_pool_is_drawn_in_grey(fig: Any) -> None:
    from matplotlib.colors import to_rgb

    shared = f"{IN_PROCESS} [{SHARED_PAGES}]"
    values = _by_gid(fig, "value:")
    assert f"bar:arrays:{shared}" not in _by_gid(fig, "bar:")
    assert values[f"value:arrays:{shared}"].get_text().endswith(f"{shared}: reference, not a pool")
    legend = _legend(fig)
    assert shared not in legend and legend.count("in-process reference, not a pool") == 1
    for bar in _by_gid(fig, "bar:").values():  # grey is the unstable rows' and the references'
        r, g, b = to_rgb(bar.get_facecolor())
        assert max(r, g, b) - min(r, g, b) > 0.05, f"{bar.get_gid()} is grey"


def test_the_axis_is_logarithmic_and_holds_every_bar_with_its_value(fig: Any) -> None:
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    lo, hi = ax.get_xlim()
    bars = {**_by_gid(fig, "bar:"), **_by_gid(fig, "reference:")}
    assert len(bars) == len(RESULTS) - 3  # every row but mp.Pool's three
    for bar in bars.values():
        assert lo < bar.get_x() and bar.get_x() + bar.get_width() < hi
    slowest = bars["bar:start:loky"]
    assert slowest.get_x() == pytest.approx(0.06)
    assert _by_gid(fig, "value:")["value:start:loky"].get_text() == "0.06x"


def test_unstable_rows_are_marked_and_stable_ones_are_not(fig: Any) -> None:
    texts = {gid: t.get_text() for gid, t in _by_gid(fig, "value:").items()}
    assert texts["value:hop:loky"] == "0.70x !"
    assert texts["value:arrays:mp.Pool"].endswith("!")  # the baseline itself was unstable
    assert "!" not in texts["value:hop:fastpool"] and "!" not in texts["value:start:loky"]
    bars = _by_gid(fig, "bar:")
    assert bars["bar:hop:loky"].get_alpha() < 1.0
    assert bars["bar:hop:fastpool"].get_alpha() in (None, 1.0)
    assert report.UNSTABLE_LABEL in _legend(fig)


def test_plot_writes_the_figure_as_a_png(tmp_path: Path) -> None:
    path = tmp_path / "ratios.png"
    report.plot(RESULTS, str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_pool_is_drawn_in_grey_however_many_rows_there_are() -> None:
    """A full run has nine pool rows (six of them fastpool's idioms): tab10's eighth colour,
    grey, would make one of them look like a faded unstable row or a reference."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    idioms = ["", "share", "empty", "arrays", "fill", "default chunksize"]
    rows = [_row("arrays", "mp.Pool", 1.0)]
    rows += [
        _row("arrays", "fastpool", 1 / (5 + i), variant=v, idiom=bool(v))
        for i, v in enumerate(idioms)
    ]
    rows += [_row("arrays", p, 1 / 1.2) for p in ("PPE", "loky", "joblib")]
    figure = report.figure(rows, "test")
    try:
        bars = _by_gid(figure, "bar:")
        assert len(bars) == 9
        for bar in bars.values():
            r, g, b = to_rgb(bar.get_facecolor())
            assert max(r, g, b) - min(r, g, b) > 0.05, f"{bar.get_gid()} is grey"
    finally:
        plt.close(figure)
