"""Zero-copy arrays (issue 3): shared arrays move as descriptors, plain ones with one copy.

"Shared" is checked, not assumed: the worker reports whether its array's base is an
arena Block (a mapping of the pool's memfd) and writes made on one side are read on
the other without any result transfer.
"""

from __future__ import annotations

import os

import _arrays
import _tasks
import numpy as np
import pytest
from _waiting import wait_workers_ready
from conftest import make_pool

import fastpool
from fastpool._runtime import _codec
from fastpool._runtime._arrays import _block_of

RESULT_S = 60


def _call_size(pool: fastpool.Pool, *args) -> int:
    return len(_codec.function_bytes(_arrays.total)) + len(
        _codec.encode_args(args, args, {}, pool._arena, [])
    )


def test_a_worker_writes_into_a_shared_output_and_the_parent_sees_it(pool):
    out = pool.zeros(1000)
    futs = [pool.submit(_arrays.fill, out, lo, lo + 500, lo + 1.0) for lo in (0, 500)]
    assert [f.result(timeout=RESULT_S) for f in futs] == [None, None]  # no array comes back
    assert (out[:500] == 1.0).all() and (out[500:] == 501.0).all()


def test_the_parent_writes_and_the_worker_sees_it(pool):
    arr = pool.zeros(10)
    for value in (7.0, 9.0):
        arr[3] = value
        assert pool.submit(_arrays.read_at, arr, 3).result(timeout=RESULT_S) == value


def test_a_256_mib_shared_array_crosses_as_a_tiny_descriptor(pool):
    arr = pool.empty(32 * 2**20)  # float64: 256 MiB
    arr[:] = 1.0
    assert _call_size(pool, arr) < 1024
    assert pool.submit(_arrays.total, arr).result(timeout=RESULT_S) == arr.size
    assert pool.submit(_arrays.info, arr).result(timeout=RESULT_S)["shared"]


def test_a_plain_large_array_goes_through_shared_memory_both_ways(pool):
    arr = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: over any ring record if pickled inline
    assert _call_size(pool, arr) < 1024
    assert pool.submit(_arrays.info, arr).result(timeout=RESULT_S)["shared"]
    out = pool.submit(_tasks.double, arr).result(timeout=RESULT_S)
    assert np.array_equal(out, arr * 2)
    assert _block_of(out) is not None  # the result arrived as a shared block, not bytes
    del out  # the last reference to the result's block: the block goes back to the arena
    assert pool._arena.usage()["live_blocks"] == 0  # and so did the copy of arr the call used


def test_blocks_of_settled_calls_are_released(pool):
    arr = np.ones(1 << 18)
    for _ in range(3):
        out = pool.submit(_tasks.double, arr).result(timeout=RESULT_S)
        del out
    assert pool._arena.usage()["live_blocks"] == 0  # no pin, no handoff reference leaked


def _layouts(pool):
    base = pool.zeros((60, 40))
    base[...] = np.arange(2400).reshape(60, 40)
    structured = pool.zeros(10, dtype=[("x", "f8"), ("y", "i4")])
    structured["x"] = np.arange(10)
    structured["y"] = -np.arange(10)
    fortran = pool.empty((30, 40), order="F")
    fortran[...] = np.arange(1200).reshape(30, 40)
    return {
        "strided": base[::3, 1::2],
        "reversed": base[::-1],
        "transposed": base.T,
        "zero_d": base[5:6, 7:8].reshape(()),
        "empty": base[:0],
        "structured": structured,
        "fortran": fortran,
        "column": fortran[:, 3],
    }


@pytest.mark.parametrize(
    "case",
    ["strided", "reversed", "transposed", "zero_d", "empty", "structured", "fortran", "column"],
)
def test_views_and_layouts_arrive_as_the_same_memory(pool, case):
    arr = _layouts(pool)[case]
    got = pool.submit(_arrays.info, arr).result(timeout=RESULT_S)
    assert got["shared"], "a view of a shared array must not be copied"
    assert (
        got["shape"] == arr.shape
        and got["strides"] == arr.strides
        and got["dtype"] == arr.dtype.str
    )
    back = pool.submit(_arrays.echo, arr).result(timeout=RESULT_S)
    assert back.shape == arr.shape and back.dtype == arr.dtype
    assert np.array_equal(back, arr)
    if arr.size:
        assert np.shares_memory(back, arr)  # a view came back: the very same bytes


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(100000.0)[::3],  # non-contiguous plain: copied once
        lambda: np.asfortranarray(np.arange(40000.0).reshape(200, 200)),
        lambda: np.zeros(20000, dtype=[("x", "f8"), ("y", "i4")]),
        lambda: np.array(3.5),  # 0-d: inline
        lambda: np.zeros((0, 5)),  # empty: inline
    ],
)
def test_plain_arrays_of_every_layout_arrive_equal(pool, make):
    arr = make()
    back = pool.submit(_arrays.echo, arr).result(timeout=RESULT_S)
    assert back.shape == arr.shape and back.dtype == arr.dtype and np.array_equal(back, arr)
    if arr.flags.f_contiguous and arr.ndim > 1 and not arr.flags.c_contiguous:
        assert pool.submit(_arrays.info, arr).result(timeout=RESULT_S)["f_contiguous"]


def test_object_dtype_cannot_be_shared_but_pickles_by_value(pool):
    with pytest.raises(TypeError, match="Python objects"):
        pool.empty(3, dtype=object)
    with pytest.raises(TypeError, match="Python objects"):
        pool.share(np.array([{"a": 1}, None] * 40000, dtype=object))
    arr = np.array([{"a": 1}, "x", None] * 30000, dtype=object)
    back = pool.submit(_arrays.echo, arr).result(timeout=RESULT_S)
    assert back.dtype == object and back[0] == {"a": 1} and back[-1] is None


def test_read_only_share_arrives_read_only_and_cannot_be_made_writeable(pool):
    arr = pool.share(np.arange(100000.0), readonly=True)
    assert not arr.flags.writeable
    assert pool.submit(_arrays.info, arr).result(timeout=RESULT_S)["writeable"] is False
    with pytest.raises(ValueError, match="read-only"):
        pool.submit(_arrays.write_at, arr, 0, 1.0).result(timeout=RESULT_S)
    with pytest.raises(ValueError):
        pool.submit(_arrays.make_writeable, arr).result(timeout=RESULT_S)
    assert arr[0] == 0.0


def test_an_array_of_another_pool_is_copied_correctly():
    with make_pool(1) as a, make_pool(1) as b:
        arr = a.zeros(100000)
        arr[:] = 2.0
        assert b.submit(_arrays.total, arr).result(timeout=RESULT_S) == 200000.0
        with pytest.raises(fastpool.SerializationError, match="another pool"):
            b.submit(_arrays.total, fastpool.transfer(arr[10:]))


def test_a_shared_array_outlives_its_pool_as_plain_memory():
    with make_pool(1) as p:
        arr = p.zeros(100000)
        view = arr[10:20]
    arr[:] = 5.0  # the mapping stays while views exist: no segfault, no lost data
    assert view.sum() == 50.0
    with pytest.raises(fastpool.PoolClosed):
        p.empty(10)
    with pytest.raises(fastpool.PoolClosed):
        p.submit(_arrays.total, arr)
    with make_pool(1) as q:  # another pool takes it by value
        assert q.submit(_arrays.total, arr).result(timeout=RESULT_S) == 500000.0


def test_a_request_that_cannot_fit_fails_before_any_work_and_says_what_is_free():
    with make_pool(1, arena_bytes=32 << 20) as p:
        with pytest.raises(fastpool.SharedMemoryError, match=r"free.*arena_bytes") as info:
            p.empty(64 << 20, dtype=np.uint8)
        assert isinstance(info.value, MemoryError)
        with pytest.raises(fastpool.SharedMemoryError):
            p.submit(_arrays.total, np.ones(8 << 20))  # 64 MiB plain array: no room to copy it into
        assert p.stats()["calls_submitted"] == 0
        assert p.submit(_arrays.total, p.zeros(1000) + 1).result(timeout=RESULT_S) == 1000.0


def test_transfer_detaches_the_senders_handle(pool):
    arr = pool.empty(1000)
    arr[:] = 1.0
    fut = pool.submit(_arrays.total, fastpool.transfer(arr))
    assert fut.result(timeout=RESULT_S) == 1000.0
    for use in (
        lambda: arr[0],
        lambda: repr(arr),
        lambda: np.sum(arr),
        lambda: arr + 1,
        lambda: len(arr),
        lambda: list(arr),
        lambda: arr.copy(),
        lambda: arr.tobytes(),
        lambda: pool.submit(_arrays.total, arr),
    ):
        with pytest.raises(fastpool.DetachedBufferError):
            use()
    assert arr.size == 0 and not arr.flags.writeable  # any path not caught sees nothing stale
    assert np.asarray(arr).size == 0  # np.asarray strips the subclass: an empty array, no error
    with pytest.raises(fastpool.DetachedBufferError):
        fastpool.transfer(arr)


def test_a_worker_transfers_a_buffer_back(pool):
    arr = pool.empty(1000)
    arr[:] = 3.0
    back = pool.submit(_arrays.double_and_transfer_back, fastpool.transfer(arr)).result(
        timeout=RESULT_S
    )
    assert (back == 6.0).all()
    back[0] = 1.0  # the parent owns it again


@pytest.mark.parametrize("bad", [np.arange(10.0), [1, 2], np.float64(1.0)])
def test_transfer_refuses_what_is_not_shared(pool, bad):
    with pytest.raises(TypeError, match="pool.empty"):
        fastpool.transfer(bad)


def test_shared_initargs_reach_every_worker_by_descriptor(tmp_path):
    data = np.arange(4 << 20, dtype=np.float64)  # 32 MiB: over the ring's record limit inline
    with make_pool(2, initializer=_arrays.store, initargs=(data,)) as p:
        assert len(p._sup.init_payload) < 2048
        wait_workers_ready(p)  # else both tasks may be queued on the first worker up
        # Each task holds its worker until both workers run one: two tasks, two workers.
        futs = [
            p.submit(_arrays.stored_info_once_all_met, str(tmp_path), p.workers)
            for _ in range(p.workers)
        ]
        replies = [f.result(timeout=RESULT_S) for f in futs]
        assert {pid for pid, _ in replies} == set(p.pids()) and len(replies) == 2
        assert all(info["shared"] for _, info in replies)
        assert p.submit(_arrays.stored_sum).result(timeout=RESULT_S) == float(data.sum())


def test_nothing_in_dev_shm_and_the_arena_fd_closes_at_shutdown():
    def fds():
        return {
            fd: os.readlink(f"/proc/self/fd/{fd}")
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        }

    shm0, fds0 = set(os.listdir("/dev/shm")), fds()
    with make_pool(2) as p:
        arr = p.share(np.ones(1 << 20))
        assert p.submit(_arrays.total, arr).result(timeout=RESULT_S) == 1 << 20
        assert any("fastpool-arena" in t for t in fds().values())
        assert set(os.listdir("/dev/shm")) == shm0
    after = fds()
    assert not any("fastpool-arena" in t for t in after.values())
    assert len(after) <= len(fds0)
    assert set(os.listdir("/dev/shm")) == shm0
