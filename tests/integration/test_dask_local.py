"""Dask's local scheduler on a fastpool pool (issue 17, section 2; docs/dask-local.md).

``dask.compute(..., scheduler=pool)`` and ``dask.config.set(scheduler=pool)`` run a
graph's tasks in the pool, sized by ``pool._max_workers``; an array one task returns
reaches the next task without a copy: the parent and both tasks share its memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import _arrays
import _faulty
import _tasks
import numpy as np
import pytest

import fastpool

dask = pytest.importorskip("dask", reason="needs dask: pip install -e '.[dask]'")
da = pytest.importorskip("dask.array", reason="needs dask[array]")
delayed = dask.delayed

MIB = 2**20


@pytest.fixture
def pool() -> Iterator[fastpool.Pool]:
    with fastpool.Pool(2) as p:
        yield p


def test_max_workers_is_the_worker_count_and_read_only(pool: fastpool.Pool) -> None:
    assert pool._max_workers == pool.workers == 2
    with pytest.raises(AttributeError):
        pool._max_workers = 3  # type: ignore[misc]


def test_compute_with_scheduler_pool_runs_the_graph_in_the_workers(pool: fastpool.Pool) -> None:
    a = delayed(_tasks.inc)(1)
    b = delayed(_tasks.add)(a, delayed(_tasks.inc)(10))
    assert dask.compute(a, b, scheduler=pool) == (2, 13)
    assert pool.stats()["calls_completed"] >= 3  # the tasks ran in the pool, not in this process


def test_config_set_scheduler_pool_applies_to_every_compute(pool: fastpool.Pool) -> None:
    x = da.arange(1000, chunks=100)
    with dask.config.set(scheduler=pool):
        assert int((x * 2).sum().compute()) == 999 * 1000
        assert delayed(_tasks.inc)(41).compute() == 42
    assert pool.stats()["calls_completed"] >= 11


def test_a_dask_array_pipeline_gives_numpys_answer(pool: fastpool.Pool) -> None:
    rng = np.random.default_rng(5)
    x_np = rng.random((4096, 256))
    x = da.from_array(x_np, chunks=(512, 256))
    got = (
        ((x - x.mean(axis=0)) / x.std(axis=0))
        .map_blocks(np.tanh)
        .sum(axis=0)
        .compute(scheduler=pool)
    )
    want = np.tanh((x_np - x_np.mean(axis=0)) / x_np.std(axis=0)).sum(axis=0)
    np.testing.assert_allclose(got, want)


def test_an_array_a_task_returns_reaches_the_next_task_without_a_copy(pool: fastpool.Pool) -> None:
    made = delayed(_arrays.make)(32 * MIB, 1.0)  # born in a worker
    poked = delayed(_arrays.poke)(made, 7, 42.0)  # the next task writes into what it received
    arr, i = dask.compute(made, poked, scheduler=pool)
    assert i == 7
    # The parent's array (Dask's cache of `made`) shows the write: the result came to
    # the parent, and went on to `poke`, as descriptors of one block of shared memory.
    assert arr[7] == 42.0 and arr[6] == 1.0


def test_an_array_in_a_tuple_a_task_returns_reaches_the_parent_without_a_copy(
    pool: fastpool.Pool,
) -> None:
    from fastpool._native import _ndarray

    # Dask wraps a task's value as [(key, (value, id), failed)]: the array sits four deep
    ((arr, where_in_worker),) = dask.compute(
        delayed(_arrays.make_with_where)(32 * MIB), scheduler=pool
    )
    assert _ndarray.address_of(arr) - pool._arena.base_address == where_in_worker
    assert arr[0] == 2.0


def test_a_task_error_keeps_its_type_through_dask(pool: fastpool.Pool) -> None:
    with pytest.raises(TypeError):
        dask.compute(delayed(_tasks.add)(1, "a"), scheduler=pool)


def test_a_dead_worker_fails_the_compute_with_worker_crashed_and_the_pool_goes_on(
    pool: fastpool.Pool,
) -> None:
    with pytest.raises(fastpool.WorkerCrashed, match="SIGKILL"):
        dask.compute(delayed(_faulty.sigkill_self)(1), scheduler=pool)
    assert dask.compute(delayed(_tasks.inc)(1), scheduler=pool) == (2,)
