"""``python -m fastpool bench --user MODULE:FUNC --args EXPR``: the tuner's question, answered
on their own function: how many workers, what chunk size, and is a pool worth it at all?

    serial      FUNC over the inputs in this process (the inputs are cut to about
                SERIAL_BUDGET_S of serial work first, and the report says so)
    chunk size  at the most workers: fastpool with each candidate and its automatic
                choice, multiprocessing.Pool with each candidate; the best of each kept
    workers     each smaller worker count, at that pool's best chunk size
    suggestion  the fewest workers within SAME_WITHIN of the fastest time, its chunk size,
                and a warning when no pool beats the serial run

Candidates for the chunk size aim at TARGET_CHUNK_S of work per chunk, from the serial
per-call time, times 1/4 and 4, and 1. Pools are started and warmed outside the timing.
Every parallel result is compared with the serial one; a difference is reported (a
function that is not deterministic, or that depends on process state).
"""

from __future__ import annotations

import importlib
import json
import math
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

SERIAL_BUDGET_S = 3.0
TARGET_CHUNK_S = 0.01
SAME_WITHIN = 0.05
_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class UsageError(ValueError):
    """Bad --user or --args: the message says what was expected."""


def resolve(target: str) -> Any:
    """``module:attr.path`` -> the object; the current directory is importable, as in a script."""
    if not _NAME.match(target):
        raise UsageError(f"{target!r} is not MODULE:NAME (for example my_module:my_func)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, attr = target.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"cannot import {module_name!r} ({exc}); run from the directory that "
            "holds it, or put it on PYTHONPATH"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{module_name} has no {attr!r}") from None
    return obj


def inputs(text: str) -> list[Any]:
    """The --args value as a list: MODULE:NAME of a sequence or of a function returning one,
    or a Python expression evaluated with numpy as ``np`` (``range(1000)``)."""
    if _NAME.match(text):
        obj = resolve(text)
        value = obj() if callable(obj) else obj
    else:
        import numpy as np

        try:
            value = eval(text, {"np": np, "numpy": np, "math": math})  # noqa: S307 - the user's own shell
        except Exception as exc:  # noqa: BLE001 - any error in their expression is a usage error
            raise UsageError(f"--args {text!r} failed: {type(exc).__name__}: {exc}") from None
    try:
        items = list(value)
    except TypeError:
        raise UsageError(
            f"--args must give an iterable of inputs, not {type(value).__name__}"
        ) from None
    if len(items) < 2:
        raise UsageError(f"--args gave {len(items)} input(s); a pool needs several to compare")
    return items


def same(a: Any, b: Any) -> bool:
    """Equal results, arrays compared element by element (NaN equal to NaN)."""
    import numpy as np

    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        try:
            return bool(np.array_equal(a, b, equal_nan=True))
        except TypeError:
            return bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b) or (a != a and b != b)  # noqa: PLR0124 - NaN
    except Exception:  # noqa: BLE001 - an object whose == raises: say they differ
        return False


def _serial(fn: Callable[[Any], Any], items: list[Any]) -> tuple[list[Any], float, list[Any]]:
    """(results, seconds, items actually used): stops adding inputs at SERIAL_BUDGET_S."""
    out = []
    t0 = time.perf_counter()
    for i, x in enumerate(items):
        out.append(fn(x))
        if time.perf_counter() - t0 > SERIAL_BUDGET_S and i + 1 >= 2:
            items = items[: i + 1]
            break
    return out, time.perf_counter() - t0, items


def chunk_candidates(per_call_s: float, n: int, workers: int) -> list[int]:
    """About TARGET_CHUNK_S of work per chunk (x 1/4, x 1, x 4), at most n / workers, and 1
    unless calls are so short that one per task would only time the hop (aim of 16 or more)."""
    top = max(1, math.ceil(n / workers))
    aim = max(1, math.ceil(TARGET_CHUNK_S / max(per_call_s, 1e-9)))
    sizes = (max(1, aim // 4), aim, aim * 4) + ((1,) if aim < 16 else ())
    return sorted({min(top, c) for c in sizes})


def _timed_map(
    pool: Any, kind: str, fn: Callable[[Any], Any], items: list[Any], chunksize: int | None
) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    if kind == "fastpool":
        out = list(pool.map(fn, items, chunksize=chunksize))
    else:
        out = pool.map(fn, items, chunksize or 1)
    return time.perf_counter() - t0, out


def _open(kind: str, workers: int) -> Any:
    from fastpool._bench import tasks

    if kind == "fastpool":
        import fastpool

        pool: Any = fastpool.Pool(workers)
        list(pool.map(tasks.warm, [0.02] * (2 * workers), chunksize=1))
    else:
        pool = multiprocessing.Pool(workers)
        pool.map(tasks.warm, [0.02] * (2 * workers), 1)
    return pool


def _close(kind: str, pool: Any) -> None:
    if kind == "fastpool":
        pool.shutdown(wait=True, cancel_futures=True)
    else:
        pool.close()
        pool.join()


def run(
    target: str,
    args_text: str,
    workers: int | None = None,
    json_path: str | None = None,
    progress: bool = True,
    out: Any = sys.stdout,
) -> int:
    """The whole --user run; returns the exit code (2 for bad usage, 1 for differing results)."""
    from fastpool._bench.report import fmt_time
    from fastpool._supervision import _sizing

    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731
    note = (
        (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    )
    try:
        fn = resolve(target)
        if not callable(fn):
            raise UsageError(f"{target} is not callable")
        items = inputs(args_text)
    except UsageError as exc:
        print(f"python -m fastpool bench --user: {exc}", file=sys.stderr)
        return 2
    n_given = len(items)
    note(f"serial: {target} over up to {n_given} inputs")
    reference, serial_s, items = _serial(fn, items)
    n = len(items)
    per_call = serial_s / n
    top = workers or _sizing.usable_cpus()
    counts = (
        [top]
        if workers
        else sorted({w for w in (1, 2, 4, 8, 16, 32, 64, top) if w <= top}, reverse=True)
    )
    cands = chunk_candidates(per_call, n, top)
    rows: list[dict[str, Any]] = [
        {"how": "serial", "workers": 1, "chunksize": None, "seconds": serial_s}
    ]
    mismatches: list[str] = []

    def measure(kind: str, pool: Any, w: int, cs: int | None) -> dict[str, Any]:
        note(f"{kind}: {w} workers, chunksize {cs or 'auto'}")
        seconds, got = _timed_map(pool, kind, fn, items, cs)
        if not (len(got) == n and all(same(a, b) for a, b in zip(got, reference, strict=True))):
            mismatches.append(f"{kind} workers={w} chunksize={cs or 'auto'}")
        row = {"how": kind, "workers": w, "chunksize": cs, "seconds": seconds}
        rows.append(row)
        return row

    best: dict[str, dict[str, Any]] = {}
    for kind in ("fastpool", "mp.Pool"):
        for w in counts:
            pool = _open(kind, w)
            try:
                if w == top:  # the chunk-size sweep, at the most workers
                    sweep = ([None] if kind == "fastpool" else []) + list(cands)
                    tried = [measure(kind, pool, w, cs) for cs in sweep]
                    best[kind] = min(tried, key=lambda r: r["seconds"])
                else:
                    measure(kind, pool, w, best[kind]["chunksize"])
            finally:
                _close(kind, pool)

    fast = min((r for r in rows if r["how"] == "fastpool"), key=lambda r: r["seconds"])
    fp_rows = [r for r in rows if r["how"] == "fastpool" and r["chunksize"] == fast["chunksize"]]
    enough = min(
        (r for r in fp_rows if r["seconds"] <= fast["seconds"] * (1 + SAME_WITHIN)),
        key=lambda r: r["workers"],
    )
    mp_best = min((r for r in rows if r["how"] == "mp.Pool"), key=lambda r: r["seconds"])

    say(
        f"## {target} over {n} inputs"
        + (
            f" (the first {n} of {n_given}: about {SERIAL_BUDGET_S:g} s of serial work)"
            if n < n_given
            else ""
        )
    )
    say(f"\nserial: {fmt_time(per_call)} a call. Pools were started and warmed before timing.\n")
    say("| how | workers | chunksize | time | calls/s | x serial | x mp.Pool (best) |")
    say("|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: r["seconds"]):
        cs = "" if r["how"] == "serial" else (r["chunksize"] or "auto")
        say(
            f"| {'**' + r['how'] + '**' if r is enough else r['how']} | {r['workers']} | {cs} | "
            f"{fmt_time(r['seconds'])} | {n / r['seconds']:,.0f} | "
            f"{serial_s / r['seconds']:.2f}x | "
            f"{mp_best['seconds'] / r['seconds']:.2f}x |"
        )
    cs_text = (
        f"chunksize={enough['chunksize']}" if enough["chunksize"] else "chunksize=None (automatic)"
    )
    say(
        f"\nSuggested: fastpool.Pool({enough['workers']}) and "
        f"pool.map({fn.__name__}, inputs, {cs_text}): "
        f"{fmt_time(enough['seconds'])}, {serial_s / enough['seconds']:.2f}x serial, "
        f"{mp_best['seconds'] / enough['seconds']:.2f}x multiprocessing.Pool at its best "
        f"({mp_best['workers']} workers, chunksize={mp_best['chunksize']})."
    )
    if enough["workers"] < fast["workers"]:
        say(f"More workers than {enough['workers']} gain less than {100 * SAME_WITHIN:.0f}% here.")
    if fast["seconds"] >= serial_s:
        say(
            f"No pool beat the serial run: each call takes {fmt_time(per_call)}, too little to "
            "pay for sending it to another process. Give each call more work (a batch of "
            "inputs), or stay serial."
        )
    if _has_big_array(items):
        say(
            "Inputs hold NumPy arrays of 1 MiB or more: allocating them with pool.empty / "
            "pool.share sends a descriptor instead of the bytes (see docs/arrays.md)."
        )
    for m in mismatches:
        say(f"WARNING: {m} returned results that differ from the serial run.")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "format": "fastpool-bench-user/1",
                    "target": target,
                    "inputs": n,
                    "per_call_s": per_call,
                    "rows": rows,
                    "suggested": {"workers": enough["workers"], "chunksize": enough["chunksize"]},
                },
                f,
                indent=1,
            )
        say(f"\nrows written to {json_path}")
    return 1 if mismatches else 0


def _has_big_array(items: list[Any]) -> bool:
    import numpy as np

    def big(x: Any) -> bool:
        if isinstance(x, np.ndarray):
            return x.nbytes >= 2**20
        return isinstance(x, (list, tuple)) and any(big(y) for y in x[:8])

    return any(big(x) for x in items[:8])
