"""Claims about the supervision policies: backoff bounds, breaker states, retry rules."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from fastpool._supervision import _policy
from fastpool._supervision._policy import (
    Backoff,
    SlotBreaker,
    TaskOptions,
    all_open,
    crash_outcome,
    should_retry,
)


def seeded_breaker(seed: int = 0, **kwargs: object) -> SlotBreaker:
    return SlotBreaker(backoff=Backoff(rng=random.Random(seed)), **kwargs)  # type: ignore[arg-type]


def fail(breaker: SlotBreaker, times: int, now: float = 0.0, cause: str = "boom") -> list[str]:
    return [breaker.on_failure(now, f"{cause} {i}")[0] for i in range(times)]


# --- Backoff -----------------------------------------------------------------


def test_ceiling_doubles_from_base_and_stops_at_cap() -> None:
    b = Backoff(base_s=0.25, cap_s=30.0)
    assert [b.ceiling(n) for n in range(1, 11)] == [0.25, 0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_ceiling_of_an_endless_failure_streak_is_the_cap_not_overflow() -> None:
    assert Backoff().ceiling(10**6) == 30.0


@pytest.mark.parametrize("n", [1, 2, 5, 8, 20])
def test_delay_is_full_jitter_over_zero_to_ceiling(n: int) -> None:
    b = Backoff(rng=random.Random(1234))
    ceiling = b.ceiling(n)
    draws = [b.delay(n) for _ in range(5000)]
    assert all(0.0 <= d <= ceiling for d in draws)
    # Full jitter reaches both ends; "equal jitter" would never go below ceiling/2.
    assert min(draws) < 0.01 * ceiling
    assert max(draws) > 0.99 * ceiling
    assert statistics.fmean(draws) == pytest.approx(ceiling / 2, rel=0.05)


def test_same_seed_same_delays() -> None:
    a, b = Backoff(rng=random.Random(7)), Backoff(rng=random.Random(7))
    assert [a.delay(n) for n in range(1, 30)] == [b.delay(n) for n in range(1, 30)]


def test_default_backoffs_do_not_share_one_random_stream() -> None:
    a, b = Backoff(), Backoff()
    a.delay(1), b.delay(1)  # each makes its Random at its first draw
    assert a._rng is not None and a._rng is not b._rng


@pytest.mark.parametrize("n", [0, -1])
def test_failure_numbers_count_from_one(n: int) -> None:
    with pytest.raises(ValueError, match="from 1"):
        Backoff().ceiling(n)
    with pytest.raises(ValueError):
        Backoff().delay(n)


@pytest.mark.parametrize(
    "base_s, cap_s", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.5), (math.inf, math.inf), (0.25, math.nan)]
)
def test_nonsense_backoff_settings_are_refused(base_s: float, cap_s: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=base_s, cap_s=cap_s)


# --- SlotBreaker -------------------------------------------------------------


def test_breaker_opens_at_exactly_the_sixth_consecutive_failure() -> None:
    b = seeded_breaker()
    assert fail(b, 5, now=10.0) == ["restart"] * 5
    assert b.state(10.0 + 31.0) == "healthy"  # backoff over, still closed after five
    action, until = b.on_failure(10.0, "sixth")
    assert (action, until) == ("open", 10.0 + 300.0)
    assert b.failures == 6


def test_max_failures_one_opens_on_the_first_failure() -> None:
    b = seeded_breaker(max_failures=1, open_s=5.0)
    assert b.on_failure(1.0, "x") == ("open", 6.0)


def test_restart_time_is_now_plus_a_delay_within_the_backoff_ceiling() -> None:
    b = seeded_breaker(seed=3)
    ceiling = Backoff().ceiling
    for n in range(1, 6):
        now = 100.0 * n
        action, at = b.on_failure(now, "crash")
        assert action == "restart"
        assert now <= at <= now + ceiling(n)
        assert b.retry_at == at


def test_backing_off_until_retry_at_then_restart_allowed() -> None:
    b = seeded_breaker(seed=5)
    _, at = b.on_failure(0.0, "crash")
    assert at > 0.0
    assert b.state(at - 1e-6) == "backing_off"
    assert b.may_restart(at - 1e-6) is False
    assert b.state(at) == "healthy"
    assert b.may_restart(at) is True
    assert b.may_restart(at) is True  # closed: a query, not a one-shot grant


def test_fresh_breaker_is_healthy_and_may_restart() -> None:
    b = SlotBreaker()
    assert b.state(0.0) == "healthy"
    assert b.may_restart(0.0) is True
    assert b.failures == 0 and b.retry_at is None and b.last_cause == ""


def test_success_resets_the_consecutive_count() -> None:
    b = seeded_breaker()
    fail(b, 5)
    b.on_success()
    assert b.failures == 0
    assert fail(b, 5) == ["restart"] * 5  # a fresh streak of five does not open
    assert b.on_failure(0.0, "sixth")[0] == "open"


def test_only_success_resets_the_count_not_restarts_or_time() -> None:
    b = seeded_breaker()
    now = 0.0
    for _ in range(5):
        _, at = b.on_failure(now, "dies while importing")
        now = at + 1000.0  # long after the backoff: time alone must not reset
        assert b.may_restart(now)  # a spawn is not a success
    assert b.on_failure(now, "dies again")[0] == "open"


def test_open_then_half_open_grants_exactly_one_trial() -> None:
    b = seeded_breaker()
    fail(b, 6, now=0.0)
    assert b.state(299.999) == "open"
    assert b.may_restart(299.999) is False
    assert b.state(300.0) == "half_open"
    assert b.may_restart(300.0) is True
    assert b.may_restart(300.0) is False
    assert b.may_restart(1000.0) is False  # still one trial, however long it runs
    assert b.state(1000.0) == "half_open"


def test_half_open_failure_reopens_at_once_for_the_full_period() -> None:
    b = seeded_breaker()
    fail(b, 6, now=0.0)
    assert b.may_restart(300.0)
    assert b.on_failure(301.0, "trial died") == ("open", 601.0)
    assert b.state(600.0) == "open"
    assert b.may_restart(601.0) is True  # the next period grants a new single trial
    assert b.may_restart(601.0) is False


def test_half_open_success_closes_the_breaker() -> None:
    b = seeded_breaker()
    fail(b, 6, now=0.0)
    assert b.may_restart(300.0)
    b.on_success()
    assert b.state(300.0) == "healthy"
    assert b.failures == 0 and b.retry_at is None
    assert b.on_failure(310.0, "later crash")[0] == "restart"


def test_breaker_keeps_last_cause_and_retry_at() -> None:
    b = seeded_breaker()
    b.on_failure(1.0, "SIGSEGV in task 3")
    _, at = b.on_failure(2.0, "SIGKILL in task 4")
    assert b.last_cause == "SIGKILL in task 4"
    assert b.last_failure_at == 2.0
    assert b.retry_at == at
    b.on_success()
    assert b.last_cause == "SIGKILL in task 4"  # kept for telemetry after recovery


@pytest.mark.parametrize("kwargs", [{"max_failures": 0}, {"open_s": -1.0}, {"open_s": math.inf}])
def test_nonsense_breaker_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SlotBreaker(**kwargs)  # type: ignore[arg-type]


# --- all_open ----------------------------------------------------------------


def test_all_open_only_when_every_slot_is_open() -> None:
    a, b = seeded_breaker(1), seeded_breaker(2)
    fail(a, 6, now=0.0, cause="a")
    assert all_open([a, b], 10.0) == (False, 0.0, "")
    fail(b, 6, now=50.0, cause="b")
    is_open, retry_after_s, cause = all_open([a, b], 60.0)
    assert is_open is True
    assert retry_after_s == pytest.approx(300.0 - 60.0)  # a goes half-open first
    assert cause == "b 5"  # the most recent failure, not the first slot's


def test_all_open_is_false_once_any_slot_is_half_open() -> None:
    a, b = seeded_breaker(1), seeded_breaker(2)
    fail(a, 6, now=0.0)
    fail(b, 6, now=100.0)
    assert all_open([a, b], 299.0)[0] is True
    assert all_open([a, b], 300.0) == (False, 0.0, "")


def test_all_open_of_no_slots_is_false() -> None:
    assert all_open([], 0.0) == (False, 0.0, "")


def test_all_open_accepts_a_generator() -> None:
    bs = [seeded_breaker(i) for i in range(3)]
    for b in bs:
        fail(b, 6, now=0.0)
    assert all_open((b for b in bs), 1.0)[0] is True


# --- TaskOptions and retries -------------------------------------------------


def test_task_options_defaults_and_derived_retries() -> None:
    opts = TaskOptions()
    assert (opts.pure, opts.timeout, opts.fallback, opts.retries) == (False, None, None, 0)
    assert TaskOptions(pure=True).retries == 1


def test_task_options_are_frozen_and_hashable() -> None:
    opts = TaskOptions(pure=True, timeout=2.5, fallback="inline")
    with pytest.raises(AttributeError):
        opts.pure = False  # type: ignore[misc]
    assert hash(opts) == hash(TaskOptions(pure=True, timeout=2.5, fallback="inline"))


@pytest.mark.parametrize("timeout", [0, -1.0, math.inf, math.nan, True, "5"])
def test_task_options_refuse_bad_timeouts(timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        TaskOptions(timeout=timeout)  # type: ignore[arg-type]


def test_task_options_refuse_unknown_fallback() -> None:
    with pytest.raises(ValueError, match="inline"):
        TaskOptions(fallback="thread")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "pure, attempts, transferred, expected",
    [
        (False, 1, False, False),  # impure: never rerun
        (True, 1, False, True),  # pure: one retry
        (True, 2, False, False),  # ...and only one
        (True, 1, True, False),  # transferred buffers belonged to the dead worker
        (False, 1, True, False),
    ],
)
def test_should_retry(pure: bool, attempts: int, transferred: bool, expected: bool) -> None:
    assert should_retry(TaskOptions(pure=pure), attempts, transferred) is expected


@pytest.mark.parametrize(
    "pure, attempts, transferred, expected",
    [
        (False, 1, False, "fail"),
        (True, 1, False, "retry"),
        (True, 2, False, "poison"),  # the second crash makes it poison
        (True, 1, True, "fail"),
    ],
)
def test_crash_outcome(pure: bool, attempts: int, transferred: bool, expected: str) -> None:
    assert crash_outcome(TaskOptions(pure=pure), attempts, transferred) == expected


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        should_retry(TaskOptions(pure=True), 0, False)


def test_policy_never_reads_the_clock() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_policy))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    imported = {a.name for n in imports for a in n.names}
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "time" not in imported and "time" not in modules
