"""A plain ``multiprocessing`` spawn of one child that imports numpy, from a fresh
interpreter that imported numpy: the yardstick for the first pool's start (issue 8,
section 4: a first pool should cost at most 1.2x this). Its own group, since it is a
process, not a pool; compare its ``fresh_ms`` with the start group's.
"""

from __future__ import annotations

from _peers import spawn_reference_s, tag

FRESH_RUNS = 3


def test_plain_spawn_importing_numpy(benchmark):
    benchmark.group = "start: plain multiprocessing spawn of a child importing numpy (reference)"
    fresh = benchmark.pedantic(spawn_reference_s, rounds=FRESH_RUNS, iterations=1)
    assert fresh > 0
    tag(
        benchmark,
        "mp spawn",
        start_method="spawn",
        fresh_ms=round(benchmark.stats.stats.median * 1e3, 1)
        if getattr(benchmark, "stats", None)
        else None,
    )
