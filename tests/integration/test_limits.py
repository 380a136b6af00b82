"""Every size a user can pass is honoured or refused clearly (issue 9, section 2).

A value the code cannot honour -- a ring over what its format holds, a queue of
zero, a memory amount that is not one, an array whose byte size overflows -- is
a ValueError or TypeError naming the argument, raised before anything starts;
never a wrap, never a silent default.  The largest accepted ring (8 GiB) is run
for real: its memory is sparse, and its positions pass 2**32 within a few round
trips, where 32-bit lengths would break.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from _tasks import double, nbytes_of

import fastpool


def _pool_refuses(exc: type, match: str, *args, **kwargs) -> None:
    with pytest.raises(exc, match=match):
        fastpool.Pool(*args, **kwargs)


# ---- ring_bytes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ring_bytes", [(8 << 30) + 4096, 1 << 40, (64 << 10) + 1, (1 << 20) + 8, 32 << 10, 0, -4096]
)
def test_a_ring_size_the_format_cannot_hold_is_a_value_error(ring_bytes):
    _pool_refuses(
        ValueError,
        r"ring_bytes must be a multiple of 4096 from 64 KiB to 8 GiB",
        1,
        ring_bytes=ring_bytes,
    )


@pytest.mark.parametrize("ring_bytes", [1.5e6, "64MiB", None, True])
def test_a_ring_size_that_is_not_an_int_is_a_type_error(ring_bytes):
    _pool_refuses(TypeError, "ring_bytes must be an int", 1, ring_bytes=ring_bytes)


def _tail(pool: fastpool.Pool, which: str) -> int:
    lay = pool._board.layout()
    return ctypes.c_uint64.from_address(lay["base"] + lay[which][0] + 64).value


def test_the_largest_ring_runs_tasks_past_32_bit_positions():
    with fastpool.Pool(1, ring_bytes=8 << 30) as pool:
        assert pool._board.max_record >= (4 << 30) - 4096  # half of it, as documented
        assert [pool.submit(double, i).result(timeout=60) for i in range(4)] == [0, 2, 4, 6]
        big = b"x" * (64 << 20)  # one 64 MiB record each way
        assert len(pool.submit(nbytes_of, big).result(timeout=60)) == len(big)
        assert list(pool.map(double, range(500), chunksize=1)) == [2 * i for i in range(500)]
        # Each emptied ring restarts a lap (8 GiB) further on: the positions are far
        # past 2**32, where a 32-bit length or position would have wrapped.
        assert _tail(pool, "task_rings") > 1 << 32 and _tail(pool, "result_rings") > 1 << 32
        assert pool.stats()["crashed"] == 0 and pool.stats()["unknown_replies"] == 0


def test_the_smallest_ring_carries_a_record_just_under_its_limit():
    with fastpool.Pool(1, ring_bytes=64 << 10) as pool:
        limit = pool._board.max_record
        assert (64 << 10) // 2 - 4096 < limit < (64 << 10) // 2
        data = b"y" * (limit - 200)  # the call's pickle: the function, the bytes, framing
        assert len(pool.submit(nbytes_of, data).result(timeout=30)) == len(data)
        # one byte more travels in shared memory instead (issue 31): it never fails for size
        assert len(pool.submit(nbytes_of, b"y" * limit).result(timeout=30)) == limit


# ---- queue, memory, arena ----------------------------------------------------------------


@pytest.mark.parametrize("max_queue", [0, -1, (1 << 40) + 1, 2.0, "10"])
def test_a_queue_bound_out_of_range_is_a_value_error(max_queue):
    _pool_refuses(ValueError, "max_queue must be an int from 1 to 2", 1, max_queue=max_queue)


def test_a_bool_queue_bound_is_refused():
    _pool_refuses((ValueError, TypeError), "max_queue", 1, max_queue=True)


def test_the_largest_queue_bound_is_accepted():
    with fastpool.Pool(1, max_queue=1 << 40) as pool:
        assert pool.submit(double, 2).result(timeout=30) == 4


@pytest.mark.parametrize(
    "value, exc, match",
    [
        ("lots", ValueError, "cannot read memory amount 'lots'"),
        (-1, ValueError, "under one byte"),
        (0, ValueError, "under one byte"),
        (2.0, ValueError, r"must be in \(0, 1\]"),
        (float("nan"), ValueError, r"must be in \(0, 1\]"),
        ("-5MB", ValueError, "cannot read memory amount"),
        ("12 parsecs", ValueError, "memory amount"),
        (True, TypeError, "memory amount must be int, float or str"),
        ([1], TypeError, "memory amount must be int, float or str"),
    ],
)
@pytest.mark.parametrize("option", ["memory_limit", "leak_threshold", "min_available_memory"])
def test_a_memory_amount_that_is_not_one_is_refused_clearly(option, value, exc, match):
    _pool_refuses(exc, match, 1, **{option: value})


@pytest.mark.parametrize(
    "arena_bytes, exc, match",
    [
        (1, ValueError, "arena_bytes must be at least 1 MiB"),
        (-1, ValueError, "arena_bytes must be at least 1 MiB"),
        (1 << 60, ValueError, "is too large for 1 workers"),
        (2.5e9, TypeError, "arena_bytes and the worker count must be integers"),
    ],
)
def test_an_arena_size_the_layout_cannot_hold_is_refused(arena_bytes, exc, match):
    _pool_refuses(exc, match, 1, arena_bytes=arena_bytes)


def test_an_arena_of_zero_bytes_is_refused():
    _pool_refuses(ValueError, "arena_bytes", 1, arena_bytes=0)


def test_the_smallest_arena_is_accepted_and_says_when_it_is_full():
    with fastpool.Pool(1, arena_bytes=1 << 20) as pool:
        a = pool.empty(1 << 16, np.uint8)
        a[:] = 1
        with pytest.raises(fastpool.SharedMemoryError, match="arena_bytes"):
            pool.empty(2 << 20, np.uint8)
        assert int(a.sum()) == 1 << 16


# ---- array shapes --------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((2**40, 2**40), float),
        ((2**62,), np.float64),
        ((2**63,), np.uint8),
        ((2**31, 2**31, 4), np.uint8),  # exactly 2**64 bytes: zero after a 64-bit wrap
    ],
)
@pytest.mark.parametrize("make", ["empty", "zeros"])
def test_an_array_whose_byte_size_overflows_is_a_value_error_not_a_wrap(make, shape, dtype):
    with fastpool.Pool(1) as pool:
        with pytest.raises(ValueError, match="more than a process can address"):
            getattr(pool, make)(shape, dtype)
        assert pool._arena.usage()["live_blocks"] == 0


def test_an_array_larger_than_the_arena_is_a_shared_memory_error_saying_so():
    with fastpool.Pool(1, arena_bytes=64 << 20) as pool:
        with pytest.raises(fastpool.SharedMemoryError, match="budget"):
            pool.empty((2**40,), np.uint8)


def test_result_too_big_for_the_arena_is_a_shared_memory_error():
    with fastpool.Pool(1, arena_bytes=8 << 20) as p:
        with pytest.raises(fastpool.SharedMemoryError):
            p.submit(np.ones, 8 << 20).result(timeout=60)  # 64 MiB of float64
        assert p.submit(double, 1).result(timeout=30) == 2


@pytest.mark.parametrize("shape", [(-1,), (3, -2)])
def test_a_negative_dimension_is_a_value_error(shape):
    with fastpool.Pool(1) as pool:
        with pytest.raises(ValueError, match="negative dimensions"):
            pool.empty(shape)


@pytest.mark.parametrize("shape", [(2.5,), "10"])
def test_a_shape_numpy_refuses_is_refused(shape):
    with pytest.raises(TypeError):
        np.empty(shape)  # what numpy.empty says
    with fastpool.Pool(1) as pool:
        with pytest.raises(TypeError):
            pool.empty(shape)


# ---- workers and other numbers ------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, -1, "lots", 2.0, True, 1024])
def test_a_worker_count_out_of_range_is_a_value_error(workers):
    _pool_refuses(ValueError, "workers must be", workers)


def test_max_workers_is_an_alias_of_workers():
    with fastpool.Pool(max_workers=2) as pool:
        assert pool.workers == 2
        assert pool.submit(double, 4).result(timeout=30) == 8
    _pool_refuses(ValueError, "max_workers must be greater than 0", max_workers=0)


def test_workers_and_max_workers_together_is_a_type_error():
    _pool_refuses(TypeError, "pass workers or max_workers", 2, max_workers=2)
    _pool_refuses(TypeError, "pass workers or max_workers", workers=1, max_workers=1)


@pytest.mark.parametrize(
    "option, value, match",
    [
        ("start_timeout", 0, "start_timeout"),
        ("start_timeout", -1, "start_timeout"),
        ("task_timeout", float("nan"), "task_timeout"),
        ("queue_timeout", -1, "queue_timeout"),
        ("hang_timeout", 0, "hang_timeout"),
        ("max_failures", 0, "max_failures"),
        ("max_tasks_per_worker", 0, "max_tasks_per_worker"),
        ("backoff_base_s", -1, "base_s"),  # says "backoff base_s", not the argument's name
        ("breaker_open_s", -1, "open_s"),  # says "open_s", not the argument's name
    ],
)
def test_a_number_out_of_range_is_a_value_error_naming_it(option, value, match):
    _pool_refuses(ValueError, match, 1, **{option: value})


def test_start_timeout_none_is_refused_naming_it():
    # every start needs a deadline: a lost spawn request would otherwise hang its slot
    _pool_refuses(
        ValueError,
        r"start_timeout must be a positive number of seconds, not None",
        1,
        start_timeout=None,
    )


@pytest.mark.parametrize("value", ["fast", -1, 0])
def test_a_memory_interval_that_is_not_a_positive_number_is_refused(value):
    _pool_refuses(
        ValueError,
        r"memory_interval_s must be a positive number of seconds",
        1,
        memory_interval_s=value,
    )


@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_a_blas_thread_count_that_is_not_positive_is_refused(value):
    _pool_refuses((ValueError, TypeError), "blas_threads", 1, blas_threads=value)


def test_a_backoff_that_is_not_a_number_is_refused_naming_it():
    _pool_refuses((ValueError, TypeError), "backoff", 1, backoff_base_s="x")


def test_oversized_initargs_spill_into_shared_memory_and_leak_nothing():
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with fastpool.Pool(
            1, ring_bytes=1 << 16, initializer=double, initargs=(list(range(100_000)),)
        ) as pool:
            assert pool.submit(double, 2).result(timeout=30) == 4
    assert len(os.listdir("/proc/self/fd")) == fds
