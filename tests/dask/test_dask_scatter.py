"""Executor.scatter: a large array crosses the network once per host, and each host's
fastpool children read it from shared memory, not from a pickle per task."""

from __future__ import annotations

import functools

import _tasks
import numpy as np
import pytest

distributed = pytest.importorskip(
    "distributed", reason="the Dask tests need the dask extra: pip install -e '.[dask]'"
)

import _dask_tasks as tasks  # noqa: E402
import dask  # noqa: E402
from _dask_support import worker_addresses  # noqa: E402

import fastpool.dask as fpd  # noqa: E402
from fastpool.errors import SerializationError  # noqa: E402

pytestmark = pytest.mark.dask

MB100 = 100_000_000


def _plugin_counts(executor) -> dict:
    return {a: s["plugin"] for a, s in executor.stats()["workers"].items()}


def test_a_scattered_array_crosses_once_per_host_for_twenty_tasks(executor, dask_client):
    arr = np.arange(MB100 // 8, dtype=np.float64)
    expected = float(arr[::4096].sum())
    before = _plugin_counts(executor)
    handle = executor.scatter(arr)  # to one worker; the other fetches it when it needs it
    try:
        holders = dask_client.who_has([handle.future])[handle.key]
        assert len(holders) == 1
        futs = []
        for addr in worker_addresses(dask_client):  # ten tasks pinned to each host
            with dask.annotate(workers=[addr]):
                futs += [executor.submit(tasks.describe, handle) for _ in range(10)]
        results = [f.result(timeout=120) for f in futs]
        # every task saw the whole array, read-only: the pool's shared copy, not a pickle
        assert {r[:3] for r in results} == {(expected, False, MB100)}

        fetched = dask_client.run(tasks.incoming_transfers, handle.key)
        for addr, sizes in fetched.items():
            # the worker that got the scatter fetched nothing; the other fetched it once
            assert sizes == ([] if addr in holders else [MB100])
        after = _plugin_counts(executor)
        for addr, c in after.items():
            assert c["shared"] - before[addr]["shared"] == 1  # one copy into shared memory
            assert c["shared_hits"] - before[addr]["shared_hits"] == 9  # then descriptors
    finally:
        handle.release()


def test_broadcast_sends_the_array_to_every_worker_up_front(executor, dask_client):
    handle = executor.scatter(np.ones(1 << 20), broadcast=True)
    try:
        assert len(dask_client.who_has([handle.future])[handle.key]) == 2
        for addr in worker_addresses(dask_client):
            with dask.annotate(workers=[addr]):
                assert executor.submit(tasks.describe, handle).result(timeout=60)[:2] == (
                    256.0,
                    False,
                )
        assert all(s == [] for s in dask_client.run(tasks.incoming_transfers, handle.key).values())
    finally:
        handle.release()


def test_a_handle_works_inside_containers_partials_and_map(executor):
    arr = np.full(1 << 16, 2.0)
    handle = executor.scatter(arr)
    try:

        def first(xs):
            return tasks.describe(xs[0])[:2]

        assert executor.submit(first, [handle]).result(timeout=60) == (32.0, False)
        assert executor.submit(functools.partial(tasks.describe, handle)).result(timeout=60)[
            :2
        ] == (32.0, False)
        got = list(executor.map(lambda d: tasks.describe(d["a"])[0], [{"a": handle}] * 3))
        assert got == [32.0] * 3
    finally:
        handle.release()


def test_a_handle_hidden_in_another_object_is_refused(executor):
    handle = executor.scatter(np.ones(4))
    try:

        class Box:
            def __init__(self, h):
                self.h = h

        with pytest.raises(SerializationError, match="ScatteredArray can be passed"):
            executor.submit(_tasks.identity, Box(handle))
    finally:
        handle.release()


def test_the_worker_drops_its_shared_copy_when_dask_releases_the_array():
    # The plugin on its own, on a stand-in worker: Dask's transition callback is the
    # event that frees the shared copy.
    import asyncio

    plugin = fpd.FastpoolPlugin("unit", workers=1)

    class Worker:
        address = "inproc://unit"
        executors: dict = {}

        class state:
            nthreads = 1

    w = Worker()
    asyncio.run(plugin.setup(w))
    try:
        assert w.executors["unit"] is plugin.pool
        shared = plugin.shared("k", np.ones(1000))
        assert plugin.shared("k", np.zeros(1000)) is shared  # cached: made once per key
        assert not shared.flags.writeable
        plugin.transition("k", "memory", "released")
        assert plugin.counts["shared_released"] == 1 and "k" not in plugin._shared
        assert plugin.shared("k", np.zeros(1000))[0] == 0.0  # a new copy after the release
    finally:
        asyncio.run(plugin.teardown(w))
    assert "unit" not in w.executors and plugin.pool.stats()["closed"]
