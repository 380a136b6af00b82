"""What the option to scale costs: the same work on fastpool.Pool and on a 2-worker Dask
LocalCluster, three ways.

    fastpool            fastpool.Pool(2) in this process
    fastpool.dask       fastpool.dask.Executor: one Dask task per call (or map chunk),
                        run in the worker's fastpool child
    Client.submit       plain Dask: client.submit(pure=False) / client.map + gather
    Client.get_executor Dask's own concurrent.futures adapter (pure=False)

Groups (one table each, ratios to fastpool; nothing asserts a time):

* per-task overhead: one no-op call, submit then result, one at a time;
* throughput: SUBMITS no-op submits, then wait for all;
* batch job: the demo's NumPy batch job (``fastpool.cli._demo_parts.process_batch`` over
  BATCHES arrays of 384 x 512 float64, ~8 ms each) through each peer's ``map``.
  The arrays travel by value, as a user's first port would send them.

A 2-core machine shows no scaling: both Dask workers and fastpool's two children
share the same two cores.  What it shows is the overhead per task a user pays for
being able to add hosts.  Skipped without the dask extra.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import _tasks
import pytest
from _peers import median_s, tag

distributed = pytest.importorskip(
    "distributed", reason="needs the dask extra: pip install -e '.[dask]'"
)

from fastpool.cli._demo_parts import make_batches, process_batch  # noqa: E402

SUBMITS = 200
BATCHES = 64
PEERS = ["fastpool", "fastpool.dask", "Client.submit", "Client.get_executor"]


class _Peer:
    """submit(fn, *args) -> a future with .result(); map(fn, items) -> list."""

    def __init__(self, name: str, submit: Any, map_: Any) -> None:
        self.name, self.submit, self.map = name, submit, map_


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@contextlib.contextmanager
def _open(name: str, client: Any) -> Iterator[_Peer]:
    if name == "fastpool":
        import fastpool

        with fastpool.Pool(2) as pool:
            yield _Peer(name, pool.submit, lambda fn, items: list(pool.map(fn, items)))
    elif name == "fastpool.dask":
        import fastpool.dask

        with fastpool.dask.Executor(client) as ex:
            yield _Peer(name, ex.submit, lambda fn, items: list(ex.map(fn, items)))
    elif name == "Client.submit":
        yield _Peer(
            name,
            lambda fn, *a: client.submit(fn, *a, pure=False),
            lambda fn, items: client.gather(client.map(fn, items, pure=False)),
        )
    else:
        ex = client.get_executor(pure=False)
        yield _Peer(name, ex.submit, lambda fn, items: list(ex.map(fn, items)))
        ex.shutdown(wait=True)


@pytest.fixture(params=PEERS)
def peer(request: pytest.FixtureRequest, dask_client: Any) -> Iterator[_Peer]:
    with _open(request.param, dask_client) as p:
        for f in [p.submit(_tasks.noop) for _ in range(8)]:  # warm: imports, pools, comms
            f.result()
        yield p


def test_dask_per_task_overhead(benchmark, peer):
    benchmark.group = "dask: per-task overhead, no-op submit then result, 2 workers"
    benchmark.pedantic(
        lambda: peer.submit(_tasks.noop).result(), rounds=100, iterations=1, warmup_rounds=5
    )
    median = median_s(benchmark)
    tag(benchmark, peer.name, tasks_per_s=round(1 / median) if median else None)


def test_dask_submit_throughput(benchmark, peer):
    benchmark.group = f"dask: throughput, {SUBMITS} no-op submits then wait, 2 workers"

    def fan_out() -> int:
        futures = [peer.submit(_tasks.noop) for _ in range(SUBMITS)]
        for f in futures:
            f.result()
        return len(futures)

    assert benchmark.pedantic(fan_out, rounds=3, iterations=1, warmup_rounds=1) == SUBMITS
    median = median_s(benchmark)
    tag(benchmark, peer.name, tasks_per_s=round(SUBMITS / median) if median else None)


def test_dask_batch_job(benchmark, peer):
    benchmark.group = (
        f"dask: the demo's batch job, map over {BATCHES} arrays of 384 x 512, 2 workers"
    )
    batches = make_batches(BATCHES)
    result = benchmark.pedantic(
        lambda: peer.map(process_batch, batches), rounds=3, iterations=1, warmup_rounds=1
    )
    assert len(result) == BATCHES and result[0][0].shape == (384, 7)
    median = median_s(benchmark)
    tag(benchmark, peer.name, items_per_s=round(BATCHES / median) if median else None)
