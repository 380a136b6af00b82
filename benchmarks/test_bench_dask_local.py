"""Dask's local scheduler on a fastpool pool (issue 17, section 2; docs/dask-local.md).

One dask.array pipeline over 256 MiB (8192 x 4096 float64 in 8 row chunks of 32 MiB),
computed four ways in the same run:

    fastpool              ``.compute(scheduler=pool)``, pool = fastpool.Pool(2), warm
    processes             ``.compute(scheduler="processes", num_workers=2)``: what a user
                          writes; Dask starts a multiprocessing pool for each compute
    processes, warm pool  the same with a multiprocessing pool made once and passed as
                          ``pool=``: Dask's process scheduler without its start-up
    threads               ``.compute(scheduler="threads", num_workers=2)``

The pipeline: random chunks made in the workers, a chunked ``(x - mean) / std`` (two
reductions, then every chunk again), a blockwise ``np.tanh`` and a column sum of squares.
Every 32 MiB intermediate that one task returns is taken by another: through fastpool
it stays in the pool's shared memory (docs/dask-local.md "zero-copy intermediates"),
through the process scheduler it is pickled both ways.  Ratios to fastpool in
report.py; nothing asserts a time.  Skipped without dask.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _peers import median_s, tag

import fastpool

da = pytest.importorskip("dask.array", reason="needs dask: pip install -e '.[dask]'")

ROWS, COLS, CHUNK_ROWS = 8192, 4096, 1024  # 256 MiB of float64, 8 chunks
WORKERS = 2
PEERS = ["fastpool", "processes", "processes, warm pool", "threads"]


def pipeline() -> Any:
    x = da.random.default_rng(0).random((ROWS, COLS), chunks=(CHUNK_ROWS, COLS))
    y = (x - x.mean(axis=0)) / x.std(axis=0)
    z = y.map_blocks(np.tanh)
    return (z * z).sum(axis=0)


@pytest.fixture(scope="module")
def reference() -> Any:
    return pipeline().compute(scheduler="sync")


@pytest.fixture(params=PEERS)
def compute(request: pytest.FixtureRequest) -> Iterator[tuple[str, Callable[[], Any]]]:
    name = request.param
    if name == "fastpool":
        with fastpool.Pool(WORKERS) as pool:
            yield name, lambda: pipeline().compute(scheduler=pool)
    elif name == "processes, warm pool":
        with multiprocessing.get_context("spawn").Pool(WORKERS) as mp_pool:
            yield name, lambda: pipeline().compute(scheduler="processes", pool=mp_pool)
    else:
        yield name, lambda: pipeline().compute(scheduler=name, num_workers=WORKERS)


def test_dask_array_pipeline(
    benchmark: Any, compute: tuple[str, Callable[[], Any]], reference: Any
) -> None:
    name, run = compute
    benchmark.group = (
        f"dask local: (x - mean) / std, tanh, sum over {ROWS * COLS * 8 >> 20} MiB "
        f"in {ROWS // CHUNK_ROWS} chunks, {WORKERS} workers"
    )
    result = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    np.testing.assert_allclose(result, reference)
    median = median_s(benchmark)
    tag(benchmark, name, mb_per_s=round(ROWS * COLS * 8 / 1e6 / median) if median else None)


# ---- one hop through Dask: a 256 MiB array from one task to the next ------------------

HOP_BYTES = 256 << 20


def _born(n_bytes: int) -> Any:
    x = np.empty(n_bytes // 8)
    x.fill(1.0)
    x[0] = time.monotonic()  # when this task ended: CLOCK_MONOTONIC is system-wide on Linux
    return x


def _born_in_tuple(n_bytes: int) -> tuple[Any, str]:
    return _born(n_bytes), "meta"


def _hop(x: Any) -> float:
    if isinstance(x, tuple):
        x = x[0]
    return time.monotonic() - float(x[0])


def _hop_from(x: Any, t0: float) -> float:
    return time.monotonic() - t0


HOPS = ["returned by a task", "returned in a tuple", "shared (pool.share)", "fresh, by value"]


@pytest.mark.parametrize("what", HOPS)
def test_dask_hop_256mib(benchmark: Any, what: str) -> None:
    """From the end of the task that made the array (or from the parent's compute call,
    for an array the parent holds) to the start of the task that takes it, through
    Dask's scheduler on a fastpool pool.  pytest-benchmark times the whole compute;
    the hop itself is ``hop_ms`` (median over the rounds), which report.py shows."""
    benchmark.group = "dask local: one 256 MiB array from one task to the next, fastpool pool"
    delayed = pytest.importorskip("dask").delayed
    hops: list[float] = []
    with fastpool.Pool(WORKERS) as pool:
        shared = pool.share(np.ones(HOP_BYTES // 8))

        def once() -> None:
            if what == "returned by a task":
                graph = delayed(_hop)(delayed(_born)(HOP_BYTES))
            elif what == "returned in a tuple":
                graph = delayed(_hop)(delayed(_born_in_tuple)(HOP_BYTES))
            else:
                arr = shared if what.startswith("shared") else np.ones(HOP_BYTES // 8)
                graph = delayed(_hop_from)(arr, time.monotonic())
            hops.append(graph.compute(scheduler=pool))

        benchmark.pedantic(once, rounds=7, iterations=1, warmup_rounds=1)
    tag(benchmark, what, hop_ms=round(statistics.median(hops[1:]) * 1e3, 2))
