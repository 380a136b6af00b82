"""Supervision policies: backoff, per-slot circuit breakers, task retries.

Everything here is a pure function of its state and a clock the caller passes in
(``now``, seconds on any monotonic clock), so the supervisor's decisions can be
tested without processes and replayed without sleeping. Nothing here calls
``time.*``, spawns, or kills.

    worker in slot i dies  -> SlotBreaker[i].on_failure(now, cause)
                              -> ("restart", at)  respawn at ``at`` (jittered backoff)
                              -> ("open", until)  stop respawning slot i until ``until``
    first reply from a new worker -> SlotBreaker[i].on_success()  (counter back to 0)
    every slot open        -> all_open(breakers, now) -> CircuitOpen(retry_after_s, last_cause)

    task's worker died     -> crash_outcome(options, attempts, transferred)
                              -> "retry" | "poison" | "fail"

Not thread-safe: the supervisor thread owns every breaker; other threads read
``state()`` for telemetry only, and a stale answer there is harmless.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    import random

__all__ = [
    "Backoff",
    "SlotBreaker",
    "BreakerState",
    "all_open",
    "TaskOptions",
    "should_retry",
    "crash_outcome",
    "DEFAULT_BASE_S",
    "DEFAULT_CAP_S",
    "DEFAULT_MAX_FAILURES",
    "DEFAULT_OPEN_S",
    "DEFAULT_START_TIMEOUT_S",
]

DEFAULT_BASE_S = 0.25
DEFAULT_CAP_S = 30.0
DEFAULT_MAX_FAILURES = 6
DEFAULT_OPEN_S = 300.0
DEFAULT_START_TIMEOUT_S = 60.0  # a worker's start, fork to READY

# 2**1000 times any sane base is far past any cap; clamping the exponent keeps
# ceiling(n) from raising OverflowError for a slot that has failed forever.
_MAX_EXPONENT = 1000

BreakerState = Literal["healthy", "backing_off", "open", "half_open"]
Action = Literal["restart", "open"]


class Backoff:
    """Exponential backoff with full jitter: ``delay(n)`` is uniform in ``[0, ceiling(n)]``.

    ``ceiling(n) = min(cap_s, base_s * 2**(n-1))`` for the n-th consecutive failure.
    Full jitter (not "equal" or no jitter) spreads the restarts of slots that
    failed together, so a shared cause (a full disk, a bad import) is not hit by
    every slot in the same instant.

    Raises ``ValueError`` for a non-positive ``base_s``, a ``cap_s`` below
    ``base_s``, or ``n < 1``. Not thread-safe (the ``rng`` is shared state).
    """

    __slots__ = ("base_s", "cap_s", "_rng")

    def __init__(
        self,
        base_s: float = DEFAULT_BASE_S,
        cap_s: float = DEFAULT_CAP_S,
        rng: random.Random | None = None,
    ) -> None:
        if not (base_s > 0 and math.isfinite(base_s)):
            raise ValueError(f"backoff base_s must be a positive number of seconds, not {base_s!r}")
        if not (cap_s >= base_s and math.isfinite(cap_s)):
            raise ValueError(
                f"backoff cap_s ({cap_s!r}) must be finite and at least base_s ({base_s!r})"
            )
        self.base_s = float(base_s)
        self.cap_s = float(cap_s)
        # A fresh Random per Backoff, not a shared default argument: tests seed
        # their own, and two pools must not draw from one stream.  Made at the first
        # restart: a first pool does not pay for importing random.
        self._rng = rng

    def ceiling(self, n: int) -> float:
        """The largest delay the n-th consecutive failure (n >= 1) can draw, in seconds."""
        if n < 1:
            raise ValueError(f"failure number n counts from 1, got {n!r}")
        return min(self.cap_s, math.ldexp(self.base_s, min(n - 1, _MAX_EXPONENT)))

    def delay(self, n: int) -> float:
        """A random delay in ``[0, ceiling(n)]`` seconds before restart number n."""
        if self._rng is None:
            import random

            self._rng = random.Random()
        return self._rng.uniform(0.0, self.ceiling(n))

    def __repr__(self) -> str:
        return f"Backoff(base_s={self.base_s!r}, cap_s={self.cap_s!r})"


class SlotBreaker:
    """Circuit breaker for one worker slot: back off on crashes, stop after too many.

    States, as ``state(now)`` reports them:

    ``healthy``
        no restart is pending: a worker may run in the slot now. ``failures``
        may still be non-zero while a respawned worker has not replied yet.
    ``backing_off``
        a worker failed; ``may_restart(now)`` is False until ``retry_at``.
    ``open``
        ``max_failures`` consecutive failures; no restart until ``retry_at``
        (``open_s`` after the last failure).
    ``half_open``
        the open period is over; ``may_restart(now)`` grants exactly one trial
        worker. Its first reply (``on_success``) closes the breaker; its failure
        reopens it at once, without climbing the backoff again.

    Not thread-safe: one supervisor thread drives it.
    """

    __slots__ = (
        "max_failures",
        "open_s",
        "backoff",
        "failures",
        "last_cause",
        "last_failure_at",
        "retry_at",
        "_open",
        "_trial_granted",
    )

    def __init__(
        self,
        max_failures: int = DEFAULT_MAX_FAILURES,
        open_s: float = DEFAULT_OPEN_S,
        backoff: Backoff | None = None,
    ) -> None:
        if max_failures < 1:
            raise ValueError(f"max_failures must be at least 1, not {max_failures!r}")
        if not (open_s >= 0 and math.isfinite(open_s)):
            raise ValueError(f"open_s must be a finite number of seconds >= 0, not {open_s!r}")
        self.max_failures = max_failures
        self.open_s = float(open_s)
        self.backoff = backoff if backoff is not None else Backoff()
        self.failures = 0
        self.last_cause = ""
        self.last_failure_at: float | None = None
        self.retry_at: float | None = None
        self._open = False
        self._trial_granted = False

    def on_failure(self, now: float, cause: str) -> tuple[Action, float]:
        """Record a worker failure in this slot; say when (and whether) to respawn.

        Returns ``("restart", at)`` with ``at = now + backoff.delay(failures)``,
        or ``("open", until)`` with ``until = now + open_s`` when this is the
        ``max_failures``-th consecutive failure, or any failure while open or
        half-open. Never raises.
        """
        was_open = self._open
        self.failures += 1
        self.last_cause = cause
        self.last_failure_at = now
        self._trial_granted = False
        if was_open or self.failures >= self.max_failures:
            # A failed half-open trial reopens for the full period: the slot
            # already proved it crash-loops, so backing off from 0.25 s again
            # would spin max_failures more workers for nothing.
            self._open = True
            self.retry_at = now + self.open_s
            return ("open", self.retry_at)
        self.retry_at = now + self.backoff.delay(self.failures)
        return ("restart", self.retry_at)

    def on_success(self) -> None:
        """A new worker in this slot answered its first task: close the breaker.

        Call on the first reply, not on spawn, or a worker that dies while
        importing or initializing would reset the count and never open the
        breaker. ``last_cause`` is kept for telemetry.
        """
        self.failures = 0
        self.retry_at = None
        self._open = False
        self._trial_granted = False

    def state(self, now: float) -> BreakerState:
        """The slot's state at ``now``; a read-only query."""
        if self._open:
            return "open" if self.retry_at is not None and now < self.retry_at else "half_open"
        if self.retry_at is not None and now < self.retry_at:
            return "backing_off"
        return "healthy"

    def may_restart(self, now: float) -> bool:
        """Whether the supervisor may spawn a worker into this slot at ``now``.

        Closed: True once the backoff delay has passed (a query; asking twice
        is harmless). Half-open: True exactly once per open period, because that
        call hands out the single trial worker; later calls return False until
        ``on_success`` or ``on_failure`` settles the trial.
        """
        state = self.state(now)
        if state == "healthy":
            return True
        if state == "half_open" and not self._trial_granted:
            self._trial_granted = True
            return True
        return False

    def __repr__(self) -> str:
        return (
            f"SlotBreaker(failures={self.failures}, open={self._open}, retry_at={self.retry_at!r}, "
            f"last_cause={self.last_cause!r})"
        )


def all_open(breakers: Iterable[SlotBreaker], now: float) -> tuple[bool, float, str]:
    """Whether every slot's breaker is open at ``now``: the pool should raise ``CircuitOpen``.

    Returns ``(True, retry_after_s, last_cause)``, where ``retry_after_s`` is the
    time until the first slot goes half-open and ``last_cause`` the cause of the
    most recent failure in any slot; else ``(False, 0.0, "")``. An empty pool
    is not "all open" (there is nothing to have failed). A half-open slot
    counts as not open: its trial worker may yet take the task.
    """
    items = list(breakers)
    if not items or any(b.state(now) != "open" for b in items):
        return (False, 0.0, "")
    retry_after_s = max(0.0, min(b.retry_at for b in items if b.retry_at is not None) - now)
    latest = max(
        items, key=lambda b: b.last_failure_at if b.last_failure_at is not None else -math.inf
    )
    return (True, retry_after_s, latest.last_cause)


class _Options(NamedTuple):
    pure: bool = False
    timeout: float | None = None
    fallback: Literal["inline"] | None = None


class TaskOptions(_Options):
    """Per-task supervision options, checked on construction.

    ``pure``
        the task has no side effects outside its return value, so running it
        again after its worker crashed is safe: it gets one retry
        (``retries == 1``), and a second crash makes it a ``PoisonTask``.
    ``timeout``
        seconds the task may run before its worker is killed; None for no limit.
    ``fallback``
        None, or ``"inline"``: when every breaker is open, run the task in the
        calling process instead of raising ``CircuitOpen``.

    Raises ``ValueError`` for a timeout that is not a positive finite number or
    an unknown fallback.
    """

    __slots__ = ()

    def __new__(
        cls,
        pure: bool = False,
        timeout: float | None = None,
        fallback: Literal["inline"] | None = None,
    ) -> TaskOptions:
        if timeout is not None and not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and timeout > 0
            and math.isfinite(timeout)
        ):
            raise ValueError(
                f"timeout must be None or a positive number of seconds, not {timeout!r}"
            )
        if fallback not in (None, "inline"):
            raise ValueError(f'fallback must be None or "inline", not {fallback!r}')
        return super().__new__(cls, pure, timeout, fallback)

    @property
    def retries(self) -> int:
        """Crashes the task may survive: 1 for a pure task, else 0."""
        return 1 if self.pure else 0


def should_retry(options: TaskOptions, attempts_so_far: int, has_transferred_buffers: bool) -> bool:
    """After the task's worker crashed, whether to run the task again in another worker.

    ``attempts_so_far`` counts the runs that have crashed, this one included
    (1 after the first crash). A task whose buffers were transferred is never
    retried: the dead worker owned them and may have half-written them, so a
    rerun would see different input. Raises ``ValueError`` for
    ``attempts_so_far < 1``.
    """
    if attempts_so_far < 1:
        raise ValueError(f"attempts_so_far counts crashed runs from 1, got {attempts_so_far!r}")
    if has_transferred_buffers:
        return False
    return attempts_so_far <= options.retries


def crash_outcome(
    options: TaskOptions, attempts_so_far: int, has_transferred_buffers: bool
) -> Literal["retry", "poison", "fail"]:
    """What the supervisor does with a task whose worker crashed.

    ``"retry"`` (``should_retry`` said yes), ``"poison"`` (a retried task killed
    another worker: raise ``PoisonTask``) or ``"fail"`` (raise ``WorkerCrashed``).
    Raises ``ValueError`` like ``should_retry``.
    """
    if should_retry(options, attempts_so_far, has_transferred_buffers):
        return "retry"
    return "poison" if attempts_so_far >= 2 else "fail"
