"""Arrays: float64 arrays of SIZES_MIB, one task at a time.

* one way: the array goes to a worker, a float comes back (``total``).
* round trip: the array goes to a worker, an array as large comes back (``double``).

The peers pickle the array through a pipe both ways; joblib memmaps arguments over
1 MiB to a file (it hashes the array on every call to name the file) and pickles
results back. fastpool runs the same calls, and, where ``Pool.share``/``Pool.empty``
exist, its shared-memory idioms as extra rows of the same group:

    fastpool [share]  pool.share(arr) inside the timed call: one copy into a segment
    fastpool [empty]  input allocated with pool.empty and filled once, before the timing
    fastpool [fill]   round trip where the worker writes into out = pool.empty(...)
                      (allocated inside the timed call), the "worker fills a shared
                      output" idiom (``fill_double``), one task, like the peers

``extra_info``: ``gb_per_s`` is the array bytes crossing (in, plus out for the round
trip) over the median time. Memory comes from a separate, untimed run of the call
(see MemorySampler in _peers.py): ``peak_mb`` is the peak RSS of parent plus workers
(inflated for forking peers: inherited pages count once per process), ``pss_mb`` the
peak PSS (shared pages split, the honest total) and ``delta_mb`` what the call added
to the PSS it started from. 256 MiB cases run few rounds: whole-suite time matters.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import _tasks
from _peers import median_s, peak_memory, tag

SIZES_MIB = [1, 16, 256]
ROUNDS = {1: 20, 16: 8, 256: 3}
MEMORY_REPEAT = {1: 10, 16: 2, 256: 1}  # a 1 MiB call can finish between two samples


def _array(mib: int) -> np.ndarray:
    return np.arange(mib * 2**20 // 8, dtype=np.float64)


def _one_way_group(mib: int) -> str:
    return f"arrays one way: {mib} MiB in, float out"


def _round_trip_group(mib: int) -> str:
    return f"arrays round trip: {mib} MiB in, {mib} MiB out"


def _check_doubled(out, arr) -> None:
    assert out.shape == arr.shape
    for i in (0, 1, arr.size // 2, arr.size - 1):
        assert out[i] == 2 * arr[i], f"element {i}: {out[i]} != 2 * {arr[i]}"


def _measure(benchmark, call, mib, peer_name, idiom, moved_bytes, start_method):
    """Time ``call`` (pedantic, few rounds), then sample its peak RSS; returns its result."""
    if peer_name == "fastpool":
        # fastpool refuses a pickle larger than its ring (SerializationError, which
        # points to pool.share()): a limit by design, reported as a skip with its
        # message, not as a failure of the suite.
        errors = pytest.importorskip("fastpool.errors")
        try:
            call()
        except errors.SerializationError as exc:
            pytest.skip(f"fastpool: {exc}")
    # (that call was fastpool's warm-up round)
    warmup_rounds = 0 if peer_name == "fastpool" else 1
    result = benchmark.pedantic(call, rounds=ROUNDS[mib], iterations=1, warmup_rounds=warmup_rounds)
    median = median_s(benchmark)
    tag(
        benchmark,
        peer_name,
        idiom=idiom,
        mib=mib,
        gb_per_s=round(moved_bytes / median / 1e9, 3) if median else None,
        start_method=start_method,
        **peak_memory(call, MEMORY_REPEAT[mib]),
    )
    return result


def _require(pool, *methods: str) -> None:
    missing = [m for m in methods if not hasattr(pool, m)]
    if missing:
        pytest.skip(f"fastpool.Pool has no {', '.join(missing)} yet")


def _shared_copy(pool, arr: np.ndarray) -> np.ndarray:
    src = pool.empty(arr.shape, arr.dtype)
    src[...] = arr
    return src


@pytest.mark.parametrize("mib", SIZES_MIB)
def test_one_way(benchmark, array_peer, mib):
    benchmark.group = _one_way_group(mib)
    arr = _array(mib)
    expected = float(arr.sum())

    def call():
        return array_peer.submit(_tasks.total, arr).result()

    got = _measure(benchmark, call, mib, array_peer.name, "", arr.nbytes, array_peer.start_method)
    assert math.isclose(got, expected)


@pytest.mark.parametrize("mib", SIZES_MIB)
def test_round_trip(benchmark, array_peer, mib):
    benchmark.group = _round_trip_group(mib)
    arr = _array(mib)

    def call():
        return array_peer.submit(_tasks.double, arr).result()

    out = _measure(benchmark, call, mib, array_peer.name, "", 2 * arr.nbytes, array_peer.start_method)
    _check_doubled(out, arr)


@pytest.mark.parametrize("mib", SIZES_MIB)
@pytest.mark.parametrize("idiom", ["share", "empty"])
def test_one_way_shared(benchmark, fastpool_peer, mib, idiom):
    benchmark.group = _one_way_group(mib)
    pool = fastpool_peer.pool
    arr = _array(mib)
    expected = float(arr.sum())
    if idiom == "share":
        _require(pool, "share")

        def call():
            return pool.submit(_tasks.total, pool.share(arr, readonly=True)).result()

    else:
        _require(pool, "empty")
        src = _shared_copy(pool, arr)

        def call():
            return pool.submit(_tasks.total, src).result()

    got = _measure(benchmark, call, mib, "fastpool", idiom, arr.nbytes, fastpool_peer.start_method)
    assert math.isclose(got, expected)


@pytest.mark.parametrize("mib", SIZES_MIB)
@pytest.mark.parametrize("idiom", ["share", "fill"])
def test_round_trip_shared(benchmark, fastpool_peer, mib, idiom):
    benchmark.group = _round_trip_group(mib)
    pool = fastpool_peer.pool
    arr = _array(mib)
    if idiom == "share":
        _require(pool, "share")

        def call():
            return pool.submit(_tasks.double, pool.share(arr, readonly=True)).result()

    else:
        _require(pool, "empty")
        src = _shared_copy(pool, arr)

        def call():
            out = pool.empty(arr.shape, arr.dtype)
            assert pool.submit(_tasks.fill_double, src, out, 0, arr.size).result() == arr.size
            return out

    out = _measure(benchmark, call, mib, "fastpool", idiom, 2 * arr.nbytes, fastpool_peer.start_method)
    _check_doubled(out, arr)  # for [fill]: the worker's writes are visible here, or it is no idiom
