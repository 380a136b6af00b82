"""Throughput: many tiny tasks, where per-task overhead is all there is.

* SUBMITS no-op tasks, each through its own ``submit``, then wait for every result:
  what a caller fanning out independent calls gets (no batching by the caller).
* ``map`` over MAP_ITEMS small ints: each peer at each of CHUNKSIZES (the report
  keeps each peer's best), fastpool also with ``chunksize=None``, its automatic choice.
"""

from __future__ import annotations

import pytest

import _tasks
from _peers import TASK_PEERS, median_s, tag

SUBMITS = 20_000
MAP_ITEMS = 200_000
CHUNKSIZES = [1000, 5000, 20000]
MAP_CASES = [
    (name, chunksize)
    for name in TASK_PEERS
    for chunksize in ([None, *CHUNKSIZES] if name == "fastpool" else CHUNKSIZES)
]


def test_submit_many(benchmark, peer):
    benchmark.group = f"throughput: {SUBMITS:,} submits then wait, {peer.workers} workers"

    def fan_out():
        futures = [peer.submit(_tasks.noop) for _ in range(SUBMITS)]
        for f in futures:
            f.result()
        return len(futures)

    assert benchmark.pedantic(fan_out, rounds=3, iterations=1, warmup_rounds=1) == SUBMITS
    median = median_s(benchmark)
    tag(benchmark, peer.name, tasks_per_s=round(SUBMITS / median) if median else None)


@pytest.mark.parametrize("peer, chunksize", MAP_CASES, indirect=["peer"])
def test_map_small_items(benchmark, peer, chunksize):
    benchmark.group = f"throughput: map over {MAP_ITEMS:,} small items, {peer.workers} workers"
    items = list(range(MAP_ITEMS))

    def run_map():
        return peer.map(_tasks.square, items, chunksize)

    result = benchmark.pedantic(run_map, rounds=5, iterations=1, warmup_rounds=1)
    assert len(result) == MAP_ITEMS and result[-1] == (MAP_ITEMS - 1) ** 2
    median = median_s(benchmark)
    tag(
        benchmark,
        peer.name,
        f"chunksize={'auto' if chunksize is None else chunksize}",
        chunksize=chunksize,
        items_per_s=round(MAP_ITEMS / median) if median else None,
    )
