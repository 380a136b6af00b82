"""The bench's round-trip rows time a settled pool: their warm-up lasts at least
LATENCY_SETTLE_S from the pool's first call, so no round is timed in the wake of a pool's
start (BLAS threads spinning out OpenBLAS's thread timeout, the first memory samples)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from fastpool._bench import runner
from fastpool._bench.scenarios import Case


def _recording(starts: list[float]):
    """A row's build whose call notes when it started, in ``starts``."""

    def build(peer):
        def call():
            starts.append(time.perf_counter())

        return call

    return build


def test_a_round_trip_row_times_no_call_before_its_settle_time_has_passed(monkeypatch):
    monkeypatch.setattr(runner, "LATENCY_SETTLE_S", 0.05)
    starts: list[float] = []
    build = _recording(starts)
    case = Case("hop-test", "hop", "fake", kind="latency", build=build, rounds=2, calls=3)
    result = runner.measure(case, SimpleNamespace(start_method="fake"))
    assert len(result.rounds) == 2
    timed = starts[-(case.rounds * case.calls) :]
    # A lower bound only: a loaded machine makes the warm-up longer, never shorter.
    assert timed[0] - starts[0] >= runner.LATENCY_SETTLE_S
    # The warm-up repeated the call until then instead of sleeping through it.
    assert len(starts) > case.rounds * case.calls + case.calls + 1


def test_a_first_moments_row_times_its_calls_at_once_after_the_first_one(monkeypatch):
    # "first moments" (issue 31, item 7): the pool as a short script meets it, so no
    # warm-up and no settle: the call that checks the result, then one timed round
    monkeypatch.setattr(runner, "LATENCY_SETTLE_S", 0.05)
    starts: list[float] = []
    build = _recording(starts)
    case = Case("hop-test-first", "hop", "fake", kind="latency", build=build, rounds=3, calls=4)
    case.first = True
    result = runner.measure(case, SimpleNamespace(start_method="fake"))
    assert len(result.rounds) == 1 and len(result.samples) == case.calls
    assert len(starts) == 1 + case.calls
    # a rounds row's first moment is its first call
    submits = Case("submits-first", "s", "fake", build=build, rounds=3, first=True)
    got = runner.measure(submits, SimpleNamespace(start_method="fake"))
    assert len(got.rounds) == 1 and len(starts) == 1 + case.calls + 1
