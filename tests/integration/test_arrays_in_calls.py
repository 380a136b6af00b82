"""Arrays anywhere in a call cross through shared memory (issue 31, item 3).

An array bound into the task's function (a ``functools.partial``, a closure cell, a
bound method's object, a user object inside any of them) travels as the arrays in
the arguments do: one copy into the arena and a descriptor, instead of its bytes in
the ring.  "Shared" is checked in the worker (the array's base is an arena Block), the
copies are counted with the parent's arena counter (``Arena.allocs``: blocks the
parent took), and every test ends with the blocks back where they were.
"""

from __future__ import annotations

import functools

import _arrays
import numpy as np
import pytest
from _waiting import live_blocks, wait_live_blocks, wait_workers_ready

import fastpool

pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix

RESULT_S = 60
N = 1 << 17  # float64: 1 MiB, over the 64 KiB threshold


@pytest.fixture
def pool():
    with fastpool.Pool(2) as p:
        wait_workers_ready(p)
        yield p


def _closure(arr):
    return lambda *_items: _arrays.described(arr)


@pytest.mark.parametrize("where", ["partial", "closure", "bound method", "object in a partial"])
def test_an_array_bound_into_the_function_arrives_in_shared_memory(pool, where):
    arr = np.arange(N, dtype=np.float64)
    fn = {
        "partial": functools.partial(_arrays.described, arr),
        "closure": _closure(arr),
        "bound method": _arrays.Holder(arr).describe,
        "object in a partial": functools.partial(_arrays.held, _arrays.Holder(arr)),
    }[where]
    baseline = live_blocks(pool)
    got = pool.submit(fn).result(timeout=RESULT_S)
    assert got["shared"], got  # pickled into the ring before issue 31
    assert got["checksum"] == arr.sum() and got["shape"] == arr.shape
    wait_live_blocks(pool, baseline)


def test_a_map_copies_an_array_bound_into_its_function_once(pool):
    arr = np.arange(N, dtype=np.float64)
    fn = functools.partial(_arrays.described, arr)
    list(pool.map(_arrays.described, [np.ones(8)]))  # the first map's own blocks, if any
    baseline, allocs = live_blocks(pool), pool._arena.allocs
    got = list(pool.map(fn, range(20), chunksize=1))  # 20 chunks, up to 6 in flight
    assert all(g["shared"] and g["checksum"] == arr.sum() for g in got)
    assert pool._arena.allocs - allocs == 1  # one copy for the map (20 before the memo)
    wait_live_blocks(pool, baseline)
    list(pool.map(fn, range(4), chunksize=1))  # a later map copies afresh: it sees changes
    assert pool._arena.allocs - allocs == 2


def test_a_second_map_of_the_same_function_copies_afresh_while_the_first_runs(pool, tmp_path):
    arr = np.zeros(N)
    fn = functools.partial(_arrays.described_after_gate, arr)
    gate = str(tmp_path / "gate")
    first = pool.map(fn, [gate], chunksize=1)  # its one chunk holds its copy in a worker
    arr += 1
    # submitted now, while the first map's copy is in flight: a memo of the function
    # (not of the map) handed it the first map's stale copy (checksum 0.0)
    second = pool.map(fn, [None] * 3, chunksize=1)
    open(gate, "w").close()
    assert [g["checksum"] for g in first] == [0.0]
    assert [g["checksum"] for g in second] == [float(N)] * 3


def test_a_maps_memo_keeps_only_the_copies_its_last_chunk_used(pool):
    from fastpool._runtime._arrays import CopyMemo

    bound = np.ones(N)
    fn = functools.partial(_arrays.described_after_gate, bound)
    memo = CopyMemo()
    items = [np.full(N, float(i)) for i in range(5)]  # distinct arrays: slices of a batch
    futs = [pool._submit_chunk(fn, [(None,)], True, memo=memo)]  # the bound array alone
    futs += [pool._submit_chunk(_arrays.described, [arr], False, memo=memo) for arr in items]
    futs.append(pool._submit_chunk(fn, [(None,)], True, memo=memo))
    # a memo that kept every copy until the map ended held the whole batch (5 + 1 here)
    assert set(memo) == {id(bound)}
    for fut in futs:
        fut.result(timeout=RESULT_S)


def test_a_map_copies_an_array_repeated_in_its_items_once(pool):
    arr = np.arange(N, dtype=np.float64)
    allocs = pool._arena.allocs
    got = list(pool.map(_arrays.described, [arr] * 12, chunksize=1))
    assert all(g["shared"] for g in got)
    assert pool._arena.allocs - allocs == 1


def test_a_map_sees_the_array_as_it_was_when_the_map_started(pool):
    arr = np.zeros(N)
    fn = functools.partial(_arrays.described, arr)
    assert [g["checksum"] for g in pool.map(fn, range(3))] == [0.0] * 3
    arr += 1  # after the map: the next one must not reuse the first one's copy
    assert [g["checksum"] for g in pool.map(fn, range(3))] == [float(N)] * 3


def _layouts() -> dict:
    base = np.arange(300 * 400, dtype=np.float64).reshape(300, 400)
    masked = np.ma.masked_array(np.arange(N, dtype=np.float64), mask=np.arange(N) % 3 == 0)
    return {
        "F order": np.asfortranarray(base),
        "a strided view": base[::2, 1::3],
        "a transposed view": base.T,
        "read-only": np.frombuffer(base.tobytes(), dtype=np.float64),
        "np.matrix": np.asmatrix(base),
        "np.ma.MaskedArray": masked,
        "big-endian int32": np.arange(N, dtype=">i4"),
        "a user subclass": np.arange(N, dtype=np.float64).view(_arrays.Tagged),
    }


@pytest.mark.parametrize("name", list(_layouts()))
def test_a_bound_array_keeps_its_class_layout_and_flags(pool, name):
    arr = _layouts()[name]
    got = pool.submit(functools.partial(_arrays.described, arr)).result(timeout=RESULT_S)
    want = _arrays.described(arr)  # what the same function sees in this process
    for key in ("cls", "dtype", "shape", "writeable", "f_contiguous", "checksum"):
        assert got[key] == want[key], (key, got, want)
    if name == "np.ma.MaskedArray":  # its own pickling, as before: the mask comes along
        assert got["masked"] == want["masked"]
    else:
        assert got["shared"], got


def test_the_mp_drop_in_maps_a_partial_over_a_50_mb_array():
    """Issue 31, item 6: it failed with SerializationError (the pickle over 32 MiB)."""
    import fastpool.mp

    arr = np.ones(50_000_000 // 8)
    with fastpool.mp.Pool(2) as pool:
        got = pool.map(functools.partial(_arrays.described, arr), range(4))
    assert all(g["shared"] and g["checksum"] == arr.size for g in got)


def test_a_sparse_matrix_bound_into_a_function_crosses_its_data_shared_and_writeable(pool):
    """The issue's case: loky hands ``.data`` over as a read-only memmap; fastpool as a
    private copy in shared memory, writeable as the caller's is (docs/arrays.md)."""
    sparse = pytest.importorskip("scipy.sparse")
    matrix = sparse.random(2000, 2000, density=0.02, format="csr", random_state=0)
    assert matrix.data.nbytes >= 64 << 10
    got = pool.submit(functools.partial(_arrays.sparse_data, matrix)).result(timeout=RESULT_S)
    assert got["shared"] and got["writeable"]
    assert got["sum"] == pytest.approx(float(matrix.sum()))


def test_an_object_array_bound_into_a_function_is_pickled_as_before(pool):
    arr = np.array([{"a": i} for i in range(20_000)], dtype=object)
    got = pool.submit(functools.partial(_arrays.objects_of, arr)).result(timeout=RESULT_S)
    assert got == list(arr)


def test_a_call_over_the_ring_limit_spills_into_shared_memory(pool):
    baseline = live_blocks(pool)
    data = b"x" * (40 << 20)  # over 32 MiB, the default ring's record limit
    assert pool.submit(len, data).result(timeout=RESULT_S) == len(data)
    masked = np.ma.masked_array(np.ones(5 << 20), mask=False)  # 40 MiB, pickled by itself
    got = pool.submit(functools.partial(_arrays.described, masked)).result(timeout=RESULT_S)
    assert got["cls"] == "MaskedArray" and got["checksum"] == masked.sum()
    wait_live_blocks(pool, baseline)


def test_a_result_over_the_ring_limit_spills_into_shared_memory(pool):
    baseline = live_blocks(pool)
    got = pool.submit(_arrays.big_list, 40, 1 << 20).result(timeout=RESULT_S)  # 40 MiB
    assert len(got) == 40 and got[7] == b"\x07" * (1 << 20)
    wait_live_blocks(pool, baseline)


def test_spilled_calls_and_results_on_a_small_ring():
    with fastpool.Pool(1, ring_bytes=64 << 10) as pool:
        wait_workers_ready(pool)
        baseline = live_blocks(pool)
        assert pool.submit(len, b"y" * 100_000).result(timeout=RESULT_S) == 100_000
        assert pool.submit(_arrays.big_list, 10, 10_000).result(timeout=RESULT_S)[3] == (
            b"\x03" * 10_000
        )
        assert list(pool.map(len, [b"z" * 50_000] * 3)) == [50_000] * 3
        wait_live_blocks(pool, baseline)


def test_initargs_over_the_ring_limit_spill_and_reach_every_worker():
    data = list(range(100_000))
    with fastpool.Pool(2, ring_bytes=64 << 10, initializer=_arrays.store, initargs=(data,)) as p:
        assert p.submit(len, b"").result(timeout=RESULT_S) == 0
        assert p.submit(_arrays.stored_len).result(timeout=RESULT_S) == len(data)


def test_a_worker_that_dies_holding_a_bound_array_leaves_no_block(pool):
    baseline = live_blocks(pool)
    arr = np.ones(N)
    fut = pool.submit(functools.partial(_arrays.die_holding, arr), 3)
    with pytest.raises(fastpool.WorkerCrashed):
        fut.result(timeout=RESULT_S)
    del fut
    wait_live_blocks(pool, baseline)
    assert pool.submit(functools.partial(_arrays.described, arr)).result(timeout=RESULT_S)["shared"]
    wait_live_blocks(pool, baseline)


def test_a_call_killed_by_its_timeout_holding_a_bound_array_leaves_no_block(tmp_path):
    with fastpool.Pool(1, task_timeout=1.0) as pool:
        wait_workers_ready(pool)
        baseline = live_blocks(pool)
        held = functools.partial(_arrays.held_until, np.ones(N))
        fut = pool.submit(held, str(tmp_path / "never"))
        with pytest.raises(fastpool.TaskTimeout):
            fut.result(timeout=RESULT_S)
        del fut
        wait_live_blocks(pool, baseline)


def test_a_cancelled_queued_call_with_a_bound_array_leaves_no_block(pool, tmp_path):
    import _tasks

    baseline = live_blocks(pool)
    gates = [tmp_path / f"gate{i}" for i in range(2)]
    busy = [pool.submit(_tasks.gate, str(g), i) for i, g in enumerate(gates)]
    queued = pool.submit(functools.partial(_arrays.described, np.ones(N)))
    assert queued.cancel()
    for g in gates:
        g.touch()
    for f in busy:
        f.result(timeout=RESULT_S)
    del queued
    wait_live_blocks(pool, baseline)
