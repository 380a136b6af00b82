"""Throughput: many tiny tasks, where per-task overhead is all there is.

* SUBMITS no-op tasks, each through its own ``submit``, then wait for every result:
  what a caller fanning out independent calls gets (no batching by the caller).
* ``map`` over MAP_ITEMS small ints: each peer at each of CHUNKSIZES (the report
  keeps each peer's best), fastpool also with ``chunksize=None``, its automatic choice.
"""

from __future__ import annotations

import pytest
from _peers import TASK_PEERS, median_s, tag

from fastpool._bench.scenarios import (
    CHUNKSIZES,
    MAP_ITEMS,
    SUBMITS,
    check_map,
    map_group,
    map_small,
    submit_many,
    submits_group,
)

MAP_CASES = [
    (name, chunksize)
    for name in TASK_PEERS
    for chunksize in ([None, *CHUNKSIZES] if name == "fastpool" else CHUNKSIZES)
]


def test_submit_many(benchmark, peer):
    benchmark.group = submits_group(SUBMITS, peer.workers)
    assert (
        benchmark.pedantic(submit_many(peer, SUBMITS), rounds=3, iterations=1, warmup_rounds=1)
        == SUBMITS
    )
    median = median_s(benchmark)
    tag(benchmark, peer.name, tasks_per_s=round(SUBMITS / median) if median else None)


@pytest.mark.parametrize("peer, chunksize", MAP_CASES, indirect=["peer"])
def test_map_small_items(benchmark, peer, chunksize):
    benchmark.group = map_group(MAP_ITEMS, peer.workers)
    call = map_small(peer, list(range(MAP_ITEMS)), chunksize)
    check_map(benchmark.pedantic(call, rounds=5, iterations=1, warmup_rounds=1), MAP_ITEMS)
    median = median_s(benchmark)
    tag(
        benchmark,
        peer.name,
        f"chunksize={'auto' if chunksize is None else chunksize}",
        chunksize=chunksize,
        items_per_s=round(MAP_ITEMS / median) if median else None,
    )
