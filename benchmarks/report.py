"""Markdown tables from a pytest-benchmark JSON file: one table per group, peers side by side.

    python -m pytest benchmarks -p no:cacheprovider --benchmark-only --benchmark-json=bench.json
    python benchmarks/report.py bench.json            # > docs/benchmarks.md's tables
    python benchmarks/report.py bench.json --all      # every row, not each peer's best

Each row is a peer (``extra_info["peer"]``), or one of fastpool's shared-memory idioms
(``extra_info["idiom"]``, shown as ``fastpool [share]``). Where a test sweeps a setting
(``map``'s chunk size), a peer's fastest row stands for it, its setting alongside,
unless ``--all``. "x fastpool" is the row's median time over plain fastpool's (its
fastest row without an idiom): above 1 the peer is slower, below 1 faster. A group
where fastpool did not run gets ratios to its fastest row instead, and says so.
Standard library only, so it runs wherever the JSON is.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict

REF_PEER = "fastpool"

# groups appear in this order (by the start of their name), then as in the file
GROUP_ORDER = ["hop", "throughput", "start", "arrays one way", "arrays round trip"]

LEGEND = {
    "p50_us": "p50/p99: percentiles of 2,000 round trips timed one by one",
    "fresh_ms": (
        "in a fresh process: the first pool of a new interpreter (pays once-per-process start-up)"
    ),
    "gb_per_s": (
        "GB/s: array bytes crossing (in, plus out for round trips) per second of median time"
    ),
    "peak_mb": "peak RSS: parent + workers; counts a shared page once per process that maps it",
    "pss_mb": "peak PSS: parent + workers with shared pages split among sharers (the real total)",
    "delta_mb": "+PSS: what the call added to the PSS it started from",
    "start_method": "start: how the peer starts workers",
    "hop_ms": "hop: from the end of the task that made the array to the start of the next task",
}

# extra_info key -> (column header, formatter), in column order
EXTRA_COLUMNS = {
    "p50_us": ("p50 (µs)", lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.1f}"),
    "p99_us": ("p99 (µs)", lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.1f}"),
    "tasks_per_s": ("tasks/s", lambda v: f"{v:,.0f}"),
    "items_per_s": ("items/s", lambda v: f"{v:,.0f}"),
    "mb_per_s": ("MB/s", lambda v: f"{v:,.0f}"),
    "hop_ms": ("hop (ms)", lambda v: f"{v:.2f}" if v < 10 else f"{v:.1f}"),
    "gb_per_s": ("GB/s", lambda v: f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"),
    "peak_mb": ("peak RSS (MB)", lambda v: f"{v:,.0f}"),
    "pss_mb": ("peak PSS (MB)", lambda v: f"{v:,.0f}"),
    "delta_mb": ("+PSS (MB)", lambda v: f"{v:,.0f}"),
    "fresh_ms": ("in a fresh process (ms)", lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.1f}"),
    "start_method": ("start", str),
}


def _time_unit(seconds: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if seconds >= 1 / scale:
            return unit, scale
    return "ns", 1e9


def _fmt_time(seconds: float, unit: str, scale: float) -> str:
    value = seconds * scale
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:,.{digits}f} {unit}"


def _fmt_ratio(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def _row(bench: dict) -> dict:
    extra = bench.get("extra_info") or {}
    peer = extra.get("peer") or bench.get("param") or bench["name"]
    idiom = extra.get("idiom") or ""
    return {
        "label": f"{peer} [{idiom}]" if idiom else peer,
        "peer": peer,
        "idiom": idiom,
        "setting": "" if idiom else (extra.get("variant") or ""),
        "median": bench["stats"]["median"],
        "rounds": bench["stats"]["rounds"],
        "extra": extra,
    }


def _best_per_label(rows: list[dict]) -> list[dict]:
    best: dict[str, dict] = {}
    for row in rows:
        if row["label"] not in best or row["median"] < best[row["label"]]["median"]:
            best[row["label"]] = row
    return list(best.values())


def group_table(name: str, rows: list[dict], show_all: bool = False) -> str:
    rows = sorted(rows if show_all else _best_per_label(rows), key=lambda r: r["median"])
    plain_ref = [r for r in rows if r["peer"] == REF_PEER and not r["idiom"]]
    ref = plain_ref[0] if plain_ref else rows[0]
    ratio_header = f"x {REF_PEER}" if plain_ref else "x fastest"
    unit, scale = _time_unit(min(r["median"] for r in rows))
    extras = [k for k in EXTRA_COLUMNS if any(r["extra"].get(k) is not None for r in rows)]
    with_setting = any(r["setting"] for r in rows)

    header = ["peer"] + (["setting"] if with_setting else []) + ["median", ratio_header]
    header += [EXTRA_COLUMNS[k][0] for k in extras]
    lines = [f"### {name}", ""]
    if not plain_ref:
        lines += [f"_{REF_PEER} did not run in this group: ratios are to the fastest row._", ""]
    # text columns (peer, setting, start) left-aligned, numbers right-aligned
    aligns = ["---"] + (["---"] if with_setting else []) + ["---:", "---:"]
    aligns += ["---" if k == "start_method" else "---:" for k in extras]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    for r in rows:
        cells = [f"**{r['label']}**" if r is ref and plain_ref else r["label"]]
        if with_setting:
            cells.append(r["setting"])
        cells += [_fmt_time(r["median"], unit, scale), _fmt_ratio(r["median"] / ref["median"])]
        for k in extras:
            v = r["extra"].get(k)
            cells.append("" if v is None else EXTRA_COLUMNS[k][1](v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_line(data: dict) -> str:
    machine = data.get("machine_info") or {}
    cpu = machine.get("cpu") or {}
    commit = data.get("commit_info") or {}
    parts = [
        cpu.get("brand_raw") or machine.get("processor") or "",
        f"{cpu['count']} CPUs" if cpu.get("count") else "",
        " ".join(
            (machine.get("python_implementation", "Python"), machine.get("python_version", ""))
        ).strip(),
        machine.get("system", "")
        + (" " + machine.get("release", "") if machine.get("release") else ""),
        f"commit {commit['id'][:10]}{' (dirty)' if commit.get('dirty') else ''}"
        if commit.get("id")
        else "",
        (data.get("datetime") or "")[:19].replace("T", " "),
    ]
    return "_" + "; ".join(p for p in parts if p) + "_"


def render(data: dict, show_all: bool = False) -> str:
    groups: OrderedDict[str, list[dict]] = OrderedDict()
    for bench in data.get("benchmarks", []):
        groups.setdefault(bench.get("group") or bench["name"], []).append(_row(bench))
    if not groups:
        return "_no benchmarks in this file_"

    def order(item: tuple[int, str]) -> tuple[int, float, int]:
        # by kind, then by array size (a failed first case must not reorder sizes)
        index, name = item
        rank = next((i for i, p in enumerate(GROUP_ORDER) if name.startswith(p)), len(GROUP_ORDER))
        mib = min((r["extra"].get("mib") or 0 for r in groups[name]), default=0)
        return rank, mib, index

    names = [name for _i, name in sorted(enumerate(groups), key=order)]
    keys = {
        k for rows in groups.values() for r in rows for k, v in r["extra"].items() if v is not None
    }
    out = [machine_line(data), ""]
    out += [
        "Median time per call (lower is better); `x fastpool` = peer time / fastpool time, "
        "so above 1 fastpool is faster. All peers ran in the same session.",
        "",
    ]
    out += [f"- {text}" for key, text in LEGEND.items() if key in keys] + [""]
    for name in names:
        out += [group_table(name, groups[name], show_all), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", help="written by pytest --benchmark-json=FILE")
    parser.add_argument(
        "--all", action="store_true", help="every row, not each peer's best setting"
    )
    args = parser.parse_args(argv)
    with open(args.json_file, encoding="utf-8") as f:
        data = json.load(f)
    sys.stdout.write(render(data, args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
