"""The bench's round-trip rows time a settled pool: their warm-up lasts at least
LATENCY_SETTLE_S from the pool's first call, so no round is timed in the wake of a pool's
start (BLAS threads spinning out OpenBLAS's thread timeout, the first memory samples)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from fastpool._bench import runner
from fastpool._bench.scenarios import Case


def test_a_round_trip_row_times_no_call_before_its_settle_time_has_passed(monkeypatch):
    monkeypatch.setattr(runner, "LATENCY_SETTLE_S", 0.05)
    starts: list[float] = []

    def build(peer):
        def call():
            starts.append(time.perf_counter())

        return call

    case = Case("hop-test", "hop", "fake", kind="latency", build=build, rounds=2, calls=3)
    result = runner.measure(case, SimpleNamespace(start_method="fake"))
    assert len(result.rounds) == 2
    timed = starts[-(case.rounds * case.calls) :]
    # A lower bound only: a loaded machine makes the warm-up longer, never shorter.
    assert timed[0] - starts[0] >= runner.LATENCY_SETTLE_S
    # The warm-up repeated the call until then instead of sleeping through it.
    assert len(starts) > case.rounds * case.calls + case.calls + 1
