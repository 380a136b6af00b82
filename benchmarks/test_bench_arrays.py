"""Arrays: float64 arrays of SIZES_MIB, one task at a time.

* one way: the array goes to a worker, a float comes back (``total``).
* round trip: the array goes to a worker, an array as large comes back (``double``).

The peers pickle the array through a pipe both ways; joblib memmaps arguments over
1 MiB to a file (it hashes the array on every call to name the file) and pickles
results back. fastpool runs the same calls, and, where ``Pool.share``/``Pool.empty``
exist, its shared-memory idioms as extra rows of the same group:

    fastpool [share]  pool.share(arr) inside the timed call: one copy into a segment
    fastpool [empty]  input allocated with pool.empty and filled once, before the timing
                      (round trip: the worker returns arr * 2, which NumPy made in the
                      worker's shared region, fastpool/_native/_alloc.pyx)
    fastpool [arrays] input made by NumPy inside ``with pool.arrays()``, once, before the
                      timing: born in shared memory, sent like [empty]'s
    fastpool [fill]   round trip where the worker writes into out = pool.empty(...)
                      (allocated inside the timed call), the "worker fills a shared
                      output" idiom (``fill_double``), one task, like the peers
    in-process        the same call in this process, no pool: the compute alone
    in-process [shared pages]  the same on a copy in a shared-memory arena (4 KiB pages
                      where shmem gets no huge pages): the floor of the shared idioms

The calls themselves are fastpool/_bench/scenarios.py's ``array_call``, the ones
``python -m fastpool bench`` times.

``extra_info``: ``gb_per_s`` is the array bytes crossing (in, plus out for the round
trip) over the median time. Memory comes from a separate, untimed run of the call
(see MemorySampler in fastpool/_bench/memory.py): ``peak_mb`` is the peak RSS of parent plus workers
(inflated for forking peers: inherited pages count once per process), ``pss_mb`` the
peak PSS (shared pages split, the honest total) and ``delta_mb`` what the call added
to the PSS it started from. 256 MiB cases run few rounds: whole-suite time matters; the
rows that take tens of milliseconds (fastpool, in-process) run more, since one stall of a
loaded machine (a THP compaction in the in-process row: seconds) would otherwise be a third
of the median's sample.
"""

from __future__ import annotations

import pytest
from _peers import median_s, open_peer, peak_memory, tag

from fastpool._bench.scenarios import (
    IDIOMS,
    IN_PROCESS,
    SHARED_PAGES,
    SIZES_MIB,
    array_call,
    check_doubled,
    check_total,
    make_array,
    one_way_group,
    round_trip_group,
)

ROUNDS = {1: 20, 16: 8, 256: 3}
FAST_ROUNDS = {1: 20, 16: 8, 256: 7}  # fastpool and in-process: a 256 MiB round is 20-100 ms
MEMORY_REPEAT = {1: 10, 16: 2, 256: 1}  # a 1 MiB call can finish between two samples


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
    rounds = (FAST_ROUNDS if peer_name in ("fastpool", IN_PROCESS) else ROUNDS)[mib]
    result = benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=warmup_rounds)
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


@pytest.mark.parametrize("mib", SIZES_MIB)
def test_one_way(benchmark, array_peer, mib):
    benchmark.group = one_way_group(mib)
    arr = make_array(mib)
    call = array_call(array_peer, "one way", "", arr)
    got = _measure(benchmark, call, mib, array_peer.name, "", arr.nbytes, array_peer.start_method)
    check_total(got, arr)


@pytest.mark.parametrize("mib", SIZES_MIB)
def test_round_trip(benchmark, array_peer, mib):
    benchmark.group = round_trip_group(mib)
    arr = make_array(mib)
    call = array_call(array_peer, "round trip", "", arr)
    out = _measure(
        benchmark, call, mib, array_peer.name, "", 2 * arr.nbytes, array_peer.start_method
    )
    check_doubled(out, arr)


@pytest.mark.parametrize("mib", SIZES_MIB)
@pytest.mark.parametrize("direction", ["one way", "round trip"])
@pytest.mark.parametrize("idiom", ["", SHARED_PAGES])
def test_compute_alone(benchmark, mib, direction, idiom):
    """The same call in this process, no pool: what the hop costs on top of the work."""
    benchmark.group = one_way_group(mib) if direction == "one way" else round_trip_group(mib)
    arr = make_array(mib)
    with open_peer(IN_PROCESS) as peer:
        call = array_call(peer, direction, idiom, arr)
        moved = arr.nbytes * (1 if direction == "one way" else 2)
        out = _measure(benchmark, call, mib, IN_PROCESS, idiom, moved, peer.start_method)
    (check_total if direction == "one way" else check_doubled)(out, arr)


@pytest.mark.parametrize("mib", SIZES_MIB)
@pytest.mark.parametrize("idiom", IDIOMS["one way"])
def test_one_way_shared(benchmark, fastpool_peer, mib, idiom):
    benchmark.group = one_way_group(mib)
    _require(fastpool_peer.pool, "share", "empty", "arrays")
    arr = make_array(mib)
    call = array_call(fastpool_peer, "one way", idiom, arr)
    got = _measure(benchmark, call, mib, "fastpool", idiom, arr.nbytes, fastpool_peer.start_method)
    check_total(got, arr)


@pytest.mark.parametrize("mib", SIZES_MIB)
@pytest.mark.parametrize("idiom", IDIOMS["round trip"])
def test_round_trip_shared(benchmark, fastpool_peer, mib, idiom):
    benchmark.group = round_trip_group(mib)
    _require(fastpool_peer.pool, "share", "empty", "arrays")
    arr = make_array(mib)
    call = array_call(fastpool_peer, "round trip", idiom, arr)
    out = _measure(
        benchmark, call, mib, "fastpool", idiom, 2 * arr.nbytes, fastpool_peer.start_method
    )
    check_doubled(out, arr)  # for [fill]: the worker's writes are visible here, or it is no idiom
