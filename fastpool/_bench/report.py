"""Tables, JSON, comparisons and plots of runner.Results.

    best_rows(results)      one row per (scenario, label): a swept setting's fastest
    table(results)          Markdown: median, p99, throughput, x mp.Pool, geometric means
    unstable(results)       pyperf-style warnings: rounds whose spread exceeds 10%
    dump / load             --json: raw samples and metadata, and back
    compare(old, new)       asv-style Before / After / Ratio per row
    figure(results)         the ratios to mp.Pool as a matplotlib Figure (fastpool[plot])
    plot(results, path)     that figure as a PNG (default_plot_path: where --plot alone writes)

"x mp.Pool" is multiprocessing.Pool's median time in the same scenario over the row's:
above 1 the row is faster. The geometric mean of a peer takes its plain rows (no
fastpool idiom) in every scenario where multiprocessing.Pool ran too.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import OrderedDict
from typing import Any

from fastpool._bench.runner import Result
from fastpool._bench.scenarios import IN_PROCESS, SPAWN_REFERENCE

REFERENCE = "mp.Pool"
UNSTABLE_SPREAD = 0.10  # pyperf's threshold: a standard deviation over 10% of the mean
JSON_FORMAT = "fastpool-bench/1"
# asv marks a change beyond this factor as significant
CHANGE_FACTOR = 1.1
NOT_IN_GEOMEAN = (IN_PROCESS, SPAWN_REFERENCE)
CONTENTION_PREFIX = "contention-"


def best_rows(results: list[Result]) -> list[Result]:
    """Good results, one per (scenario, label): the fastest variant of a swept setting."""
    best: OrderedDict[tuple[str, str], Result] = OrderedDict()
    for r in results:
        if r.error or not r.rounds:
            continue
        key = (r.scenario, r.label)
        if key not in best or r.median < best[key].median:
            best[key] = r
    return list(best.values())


def ratios(results: list[Result]) -> dict[tuple[str, str], float]:
    """(scenario, label) -> mp.Pool's median over the row's, where mp.Pool ran and both are
    above 0 (a memory row's figure can be 0 or less: no ratio then)."""
    rows = best_rows(results)
    ref = {r.scenario: r.median for r in rows if r.label == REFERENCE}
    return {
        (r.scenario, r.label): ref[r.scenario] / r.median
        for r in rows
        if r.scenario in ref and ref[r.scenario] > 0 and r.median > 0
    }


def is_contention(scenario: str) -> bool:
    """A row of the contention section (contention.py), under the load the bench makes."""
    return scenario.startswith(CONTENTION_PREFIX)


def geomeans(results: list[Result], contention: bool = False) -> dict[str, tuple[float, int]]:
    """peer -> (geometric mean of its ratios to mp.Pool, how many scenarios), plain rows only:
    of the quiet scenarios, or with ``contention`` of the contention section's timed ones
    (its idle-cost and memory rows are no speed)."""
    kinds = {r.scenario: r.kind for r in results}
    per_peer: dict[str, list[float]] = {}
    for (scenario, label), ratio in ratios(results).items():
        if "[" in label or label in NOT_IN_GEOMEAN or label == REFERENCE:
            continue
        if is_contention(scenario) != contention or kinds.get(scenario) == "value":
            continue
        per_peer.setdefault(label, []).append(ratio)
    return {p: (math.exp(sum(map(math.log, v)) / len(v)), len(v)) for p, v in per_peer.items()}


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6), ("ns", 1e9)):
        if seconds * scale >= 1 or unit == "ns":
            value = seconds * scale
            digits = 0 if value >= 100 else 1 if value >= 10 else 2
            return f"{value:,.{digits}f} {unit}"
    raise AssertionError("unreachable")


def fmt_value(r: Result, value: float) -> str:
    """A row's figure in its unit: a time, or a value case's CPU time per second or MiB."""
    if r.value_unit == "MiB":
        return f"{value:,.0f} MiB"
    if r.value_unit == "CPU s/s":
        return (fmt_time(value) if value > 0 else "0 s") + "/s"
    return fmt_time(value)


def fmt_ratio(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def fmt_spread(spread: float | None) -> str:
    """The rounds' standard deviation as a percentage of the median; ``!`` when unstable."""
    if spread is None:
        return ""
    return f"{100 * spread:.0f}%" + (" !" if spread > UNSTABLE_SPREAD else "")


def fmt_processes(result: Result) -> str:
    """min / median / max of the per-process medians, and how many processes."""
    medians = sorted(result.extra.get("process_medians") or [])
    if len(medians) < 2:
        return ""
    mid = statistics.median(medians)
    low, high = fmt_value(result, medians[0]), fmt_value(result, medians[-1])
    return f"{low} / {fmt_value(result, mid)} / {high} ({len(medians)})"


def fmt_rate(value: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{value:.2f} GB/s" if value >= 0.1 else f"{value:.3f} GB/s"
    return f"{value:,.0f} {unit}"


def table(results: list[Result]) -> str:
    """The Markdown table, scenarios in running order, rows fastest first within each."""
    rows = best_rows(results)
    ratio = ratios(results)
    has_memory = any("delta_mb" in r.extra for r in rows)
    head = ["scenario", "peer", "setting", "median", "±", "processes: min / median / max (n)"]
    head += ["p99", "throughput", "x mp.Pool"]
    head += ["+PSS (MB)"] if has_memory else []
    lines = [
        "| " + " | ".join(head) + " |",
        "|"
        + "|".join(
            ["---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:"]
            + (["---:"] if has_memory else [])
        )
        + "|",
    ]
    groups: OrderedDict[str, list[Result]] = OrderedDict()
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    for group, members in groups.items():
        for i, r in enumerate(sorted(members, key=lambda r: r.median)):
            p99 = r.p99
            cells = [
                group if i == 0 else "",
                f"**{r.label}**" if r.peer == "fastpool" and not r.idiom else r.label,
                "" if r.idiom else r.variant,
                fmt_value(r, r.median),
                fmt_spread(r.spread),
                fmt_processes(r),
                fmt_time(p99) if p99 is not None else "",
                fmt_rate(r.ops / r.median, r.unit) if r.kind in ("rounds", "latency") else "",
                fmt_ratio(ratio[(r.scenario, r.label)]) if (r.scenario, r.label) in ratio else "",
            ]
            if has_memory:
                cells.append(str(r.extra["delta_mb"]) if "delta_mb" in r.extra else "")
            lines.append("| " + " | ".join(cells) + " |")
    means = [("**geometric mean**", geomeans(results))]
    means.append(("**geometric mean, contention**", geomeans(results, contention=True)))
    for title, peer, (value, n) in (
        (title, peer, got)
        for title, of in means
        for peer, got in sorted(of.items(), key=lambda kv: -kv[1][0])
    ):
        cells = [
            title,
            peer,
            f"{n} scenarios",
            "",
            "",
            "",
            "",
            "",
            f"**{fmt_ratio(value)}**",
        ]
        lines.append("| " + " | ".join(cells + ([""] if has_memory else [])) + " |")
    return "\n".join(lines)


LEGEND = (
    "median and p99: time per call (p99 over every call, for the round trips); ±: the rounds' "
    "standard deviation over their median (! above 10%); processes: the medians of the fresh "
    "processes the rounds ran in, peers interleaved (a bimodal figure shows here); "
    "throughput: calls, "
    "tasks, items or array GB (in, plus out for round trips) per second of median time; x mp.Pool: "
    "multiprocessing.Pool's median over the row's, above 1 is faster; +PSS: what one call added to "
    "the proportional set size of the parent and its workers (shared pages split among sharers). "
    "[share], [empty], [arrays], [fill]: fastpool's shared-memory idioms; in-process: the "
    "compute alone (in-process [shared pages]: on an array in shared memory)."
)
CONTENTION_LEGEND = (
    "contention, idle and memory rows (--section contention; docs/benchmarks.md): CPU hogs are "
    "`while True: pass` in new interpreters, one per usable CPU, at the bench's own nice value, "
    "running through the rows' warm-up and rounds and ended by pid after; the programs row "
    "runs that many new interpreters, each with its own pool, timing round trips over the same "
    "second, and shows the slowest one's median; idle: CPU time per second of the bench "
    "process and every process under it (parent and workers, psutil cpu_times) over a window "
    "after a settle, with nothing submitted; memory: PSS (psutil memory_full_info) of the "
    "parent and its workers added by the batch over a baseline that holds the array and its "
    "faulted output, at its peak and after the settle. For those two, x mp.Pool is still "
    "mp.Pool's figure over the row's: above 1 costs less."
)


def unstable(results: list[Result]) -> list[str]:
    """pyperf-style: a warning when a shown row's rounds spread beyond UNSTABLE_SPREAD of their
    median (the rows marked ``!`` in the ± column); empty when every figure is stable."""
    bad = [r for r in best_rows(results) if (r.spread or 0.0) > UNSTABLE_SPREAD]
    if not bad:
        return []
    worst = max(bad, key=lambda r: r.spread or 0.0)
    return [
        f"WARNING: {len(bad)} of {len(best_rows(results))} figures are unstable: the standard "
        f"deviation of their rounds exceeds {100 * UNSTABLE_SPREAD:.0f}% of the median (marked ! "
        f"in the ± column; worst: {worst.group} / {worst.label}, "
        f"{100 * (worst.spread or 0):.0f}%). "
        "Something else is using the CPUs, or the rounds are too few: close other programs, run "
        "again, or run without --quick; compare ratios rather than times."
    ]


def failures(results: list[Result]) -> list[str]:
    return [
        f"{r.group} / {r.label}{f' [{r.variant}]' if r.variant and not r.idiom else ''}: {r.error}"
        for r in results
        if r.error
    ]


# ---- JSON ---------------------------------------------------------------------------------


def dump(results: list[Result], env: dict[str, Any], meta: dict[str, Any], path: str) -> None:
    data = {
        "format": JSON_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": env,
        "metadata": meta,
        "results": [r.to_dict() for r in results],
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def load(path: str) -> tuple[list[Result], dict[str, Any]]:
    """(results, the whole document) from a file ``dump`` wrote; ValueError for anything else."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
        raise ValueError(
            f'{path} is not a `python -m fastpool bench --json` file (no "format": "{JSON_FORMAT}")'
        )
    return [Result.from_dict(r) for r in data["results"]], data


# ---- compare ------------------------------------------------------------------------------


def compare(
    old: list[Result], new: list[Result], old_name: str = "before", new_name: str = "after"
) -> str:
    """asv-style: each row in both runs, Before / After / Ratio (after over before; below 1
    is faster now). ``+`` marks a row over CHANGE_FACTOR slower whose rounds do not overlap
    the old ones (every new round slower than every old one), ``-`` the same faster, and
    ``~`` a ratio beyond the factor that the spread of the rounds can explain."""
    before = {(r.scenario, r.label): r for r in best_rows(old)}
    after = {(r.scenario, r.label): r for r in best_rows(new)}
    lines = [
        f"Before: {old_name}",
        f"After:  {new_name}",
        "",
        "|   | Before | After | Ratio | benchmark |",
        "|---|---:|---:|---:|---|",
    ]
    worse = better = noisy = 0
    for key, a in after.items():
        b = before.get(key)
        if b is None or b.median <= 0 or a.median <= 0:
            continue  # no ratio of a memory figure at or below 0
        ratio = a.median / b.median
        mark = " "
        if ratio > CHANGE_FACTOR:
            mark = "+" if min(a.rounds) > max(b.rounds) else "~"
        elif ratio < 1 / CHANGE_FACTOR:
            mark = "-" if max(a.rounds) < min(b.rounds) else "~"
        noisy += mark == "~"
        worse += mark == "+"
        better += mark == "-"
        lines.append(
            f"| {mark} | {fmt_value(b, b.median)} | {fmt_value(a, a.median)} | {ratio:.2f} | "
            f"{a.group} / {a.label} |"
        )
    only = sorted(set(before) ^ set(after))
    lines.append("")
    if only:
        lines.append(
            f"{len(only)} row(s) in one run only: " + "; ".join(f"{s} / {lab}" for s, lab in only)
        )
    if worse:
        lines.append(
            f"SOME BENCHMARKS GOT SLOWER: {worse} row(s) marked + (ratio > {CHANGE_FACTOR})."
        )
    if better:
        lines.append(
            f"SOME BENCHMARKS GOT FASTER: {better} row(s) marked - "
            f"(ratio < {1 / CHANGE_FACTOR:.2f})."
        )
    if noisy:
        lines.append(
            f"{noisy} row(s) marked ~ moved by more than a factor of {CHANGE_FACTOR}, but within "
            "the spread of their rounds: noise, not a change (run again, or without --quick)."
        )
    if not worse and not better:
        lines.append(f"No row changed by more than a factor of {CHANGE_FACTOR} beyond its noise.")
    return "\n".join(lines)


# ---- plot ---------------------------------------------------------------------------------

PLOT_EXTRA = "pip install 'fastpool[plot]'"


def require_matplotlib() -> None:
    """Raise ImportError naming the extra when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(
            f"--plot draws with matplotlib, which is not installed: {PLOT_EXTRA}"
        ) from None


# Reference rows are not pools: the compute alone in the parent, and a bare spawn of a child.
REFERENCE_ROWS = {
    IN_PROCESS: "in-process reference, not a pool",
    SPAWN_REFERENCE: "spawn reference (mp spawn + import numpy), not a pool",
}
BASELINE_LABEL = "multiprocessing.Pool = 1.00x (baseline)"
UNSTABLE_LABEL = f"! faded: unstable, rounds spread over {100 * UNSTABLE_SPREAD:.0f}% of the median"
# The pools' colours: tab10 without its grey, which is the unstable rows' (faded) grey and
# the references' edge; then tab20's light shades, its greys left out too.
_TAB10 = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
    "#17becf",
)  # fmt: skip
_TAB20_LIGHT = (
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d",
    "#9edae5",
)  # fmt: skip
POOL_COLOURS = _TAB10 + _TAB20_LIGHT


def is_reference(r: Result) -> bool:
    """A reference row, not a pool: the compute alone in-process (``in-process`` and its
    variants, ``in-process [shared pages]``), or the bare spawn."""
    return r.peer in REFERENCE_ROWS


def figure(results: list[Result], title: str = "") -> Any:
    """The ratios to multiprocessing.Pool as a matplotlib Figure, one block per scenario.

    Bars run from 1 (multiprocessing.Pool, drawn in each block as a diamond at 1.00x on the
    labelled baseline) to each row's ratio on a log axis whose limits hold every bar and its
    value: right of the line is faster, left slower. The reference rows (the compute alone
    in-process, on NumPy's array or on shared pages, and a bare spawn) are hatched and unfilled,
    named as references in the legend and beside the bar, never in a pool's colour,
    and a row whose rounds spread beyond UNSTABLE_SPREAD is faded and marked ``!``. Artists
    carry gids (``baseline``, ``mp:<group>``, ``bar:<group>:<label>``, ``reference:...`` and
    ``value:...`` for the written ratio) so that tests can read the structure back."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # a file, not a window: works on servers and in CI
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ratio = ratios(results)
    groups: OrderedDict[str, list[tuple[Result, float]]] = OrderedDict()
    for r in best_rows(results):
        if (r.scenario, r.label) in ratio:
            groups.setdefault(r.group, []).append((r, ratio[(r.scenario, r.label)]))
    peers = sorted(
        {
            r.label
            for rows in groups.values()
            for r, _ in rows
            if not is_reference(r) and r.label != REFERENCE
        },
        key=lambda s: (not s.startswith("fastpool"), s),
    )
    colours = {lab: POOL_COLOURS[i % len(POOL_COLOURS)] for i, lab in enumerate(peers)}

    def order(r: Result) -> tuple[int, str]:
        """Pools, then the baseline, then the references (a reference's variants by name)."""
        if is_reference(r):
            return len(peers) + 1 + list(REFERENCE_ROWS).index(r.peer), r.label
        return (peers.index(r.label) if r.label in peers else len(peers)), r.label

    values = [v for rows in groups.values() for _, v in rows] + [1.0]
    # Room on both sides for the value written beside the outermost bars (log axis).
    lo, hi = min(values) / 6.0, max(values) * 6.0
    n_bars = sum(len(v) for v in groups.values())
    fig, ax = plt.subplots(figsize=(13, 1.6 + 0.2 * n_bars + 0.25 * len(groups)))
    y = 0.0
    ticks, names = [], []
    for group, rows in reversed(groups.items()):
        rows.sort(key=lambda row: order(row[0]), reverse=True)
        top = y
        for r, value in rows:
            shaky = (r.spread or 0.0) > UNSTABLE_SPREAD
            text = fmt_ratio(value) + (" !" if shaky else "")
            key = f"{group}:{r.label}"
            if r.label == REFERENCE:
                ax.plot(
                    [1.0],
                    [y],
                    marker="D",
                    color="black",
                    markersize=4,
                    linestyle="none",
                    gid=f"mp:{group}",
                )
                text = "1.00x mp.Pool (baseline)" + (" !" if shaky else "")
            elif is_reference(r):
                ax.barh(
                    y,
                    abs(value - 1.0),
                    left=min(value, 1.0),
                    height=0.8,
                    facecolor="none",
                    edgecolor="dimgray",
                    hatch="////",
                    linestyle="--",
                    linewidth=0.8,
                    alpha=0.45 if shaky else 1.0,
                    gid=f"reference:{key}",
                )
                text += f" {r.label}: reference, not a pool"
            else:
                ax.barh(
                    y,
                    abs(value - 1.0),
                    left=min(value, 1.0),
                    height=0.8,
                    color=colours[r.label],
                    alpha=0.45 if shaky else 1.0,
                    gid=f"bar:{key}",
                )
            right = value >= 1.0
            if r.label == REFERENCE or (is_reference(r) and not right):
                at, right = 1.2, True  # clear of the diamond; a long label must not leave the axes
            else:
                at = max(value, 1.0) * 1.06 if right else value / 1.06
            ax.text(
                at,
                y,
                text,
                va="center",
                ha="left" if right else "right",
                fontsize=6,
                color="firebrick" if shaky else "black",
                gid=f"value:{key}",
            )
            y += 1.0
        ticks.append((top + y - 1.0) / 2)
        names.append(group)
        y += 0.8  # a gap between scenarios
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.axvline(1.0, color="black", linewidth=1.0, gid="baseline")
    ax.set_yticks(ticks, names, fontsize=7)
    ax.set_ylim(-0.8, y - 0.2)
    ax.set_xlabel(
        "x multiprocessing.Pool: its median time over this row's "
        "(log scale; right of 1 is faster, left slower)"
    )
    ax.set_title(title or "python -m fastpool bench", fontsize=9)
    handles: list[Any] = [Patch(color=colours[lab], label=lab) for lab in peers]
    handles.append(Line2D([], [], color="black", marker="D", markersize=4, label=BASELINE_LABEL))
    handles += [
        Patch(
            facecolor="none",
            edgecolor="dimgray",
            hatch="////",
            linestyle="--",
            label=REFERENCE_ROWS[peer],
        )
        for peer in REFERENCE_ROWS
        if any(r.peer == peer for rows in groups.values() for r, _ in rows)
    ]
    if any((r.spread or 0.0) > UNSTABLE_SPREAD for rows in groups.values() for r, _ in rows):
        handles.append(Patch(color="gray", alpha=0.45, label=UNSTABLE_LABEL))
    ax.legend(
        handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0
    )
    fig.tight_layout()
    return fig


def default_plot_path() -> str:
    """Where ``--plot`` without a path writes: ``fastpool-bench-<time>-<pid>.png`` in the
    temporary directory. Not the current directory, which is often a checkout, where a
    stray PNG shows as an untracked file."""
    import tempfile

    name = f"fastpool-bench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.png"
    return os.path.join(tempfile.gettempdir(), name)


def plot(results: list[Result], path: str, title: str = "") -> None:
    """Write ``figure(results, title)`` to ``path`` as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(results, title)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")  # long scenario names must not be cut
    finally:
        plt.close(fig)
