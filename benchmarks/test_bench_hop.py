"""No-op round trip: submit one task, wait for its result, repeat.

This is the pool's fixed cost per task (pickling, the hop to the worker and back,
the wake-ups), with nothing to compute. pytest-benchmark times the call for the
median in the report; a separate loop of LATENCY_CALLS calls, each timed on its own
with perf_counter_ns, gives the p50 and p99 in ``extra_info`` (the tail is what
wake-up latency and lost futex wake-ups show up in).
"""

from __future__ import annotations

import time

import pytest
from _peers import tag

from fastpool._bench.scenarios import LATENCY_CALLS, hop_group, round_trip


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e3


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.benchmark(max_time=0.5, min_rounds=200)
def test_noop_round_trip(benchmark, peer, workers):
    benchmark.group = hop_group(workers)
    call = round_trip(peer)

    latencies_ns = []
    for _ in range(LATENCY_CALLS):
        t0 = time.perf_counter_ns()
        call()
        latencies_ns.append(time.perf_counter_ns() - t0)
    latencies_ns.sort()
    tag(
        benchmark,
        peer.name,
        p50_us=round(_percentile(latencies_ns, 0.50), 1),
        p99_us=round(_percentile(latencies_ns, 0.99), 1),
        start_method=peer.start_method,
    )

    assert benchmark(call) is None
