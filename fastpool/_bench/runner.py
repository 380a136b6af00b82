"""Times the cases of scenarios.catalog() for ``python -m fastpool bench``.

    run(cases, on_case)   opens each (peer, workers) once, runs its cases, closes it,
                          then the fresh-process cases; one Result per case
    measure(case, peer)   warm-up call (its result checked), then the timed rounds

Each round of a "rounds" case is one call, timed with perf_counter; a "latency" case
times every call of a round and keeps them (for the p99), the round's median being its
value; a "fresh" case starts a new interpreter per round. Memory comes from extra,
untimed calls under a MemorySampler, so its sampling thread never slows a timed one.
A peer that cannot run here, or a case that raises, gives a Result with ``error`` set,
and the run goes on.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fastpool._bench import peers as _peers
from fastpool._bench.memory import peak_memory
from fastpool._bench.scenarios import IN_PROCESS, SPAWN_REFERENCE, Case

ROUND_MIN_S = 0.02
MAX_INNER = 50


@dataclass
class Result:
    """What one case measured. Times are seconds per call."""

    scenario: str
    group: str
    peer: str
    variant: str
    idiom: bool
    workers: int
    kind: str
    unit: str
    ops: float
    rounds: list[float] = field(default_factory=list)
    samples: list[float] = field(default_factory=list)  # latency: every call, for the p99
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, case: Case) -> Result:
        return cls(
            case.scenario,
            case.group,
            case.peer,
            case.variant,
            case.idiom,
            case.workers,
            case.kind,
            case.unit,
            case.ops,
            extra=dict(case.extra),
        )

    @property
    def label(self) -> str:
        return f"{self.peer} [{self.variant}]" if self.idiom else self.peer

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def p99(self) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    @property
    def spread(self) -> float | None:
        """Standard deviation of the rounds over their median (pyperf warns above 10%)."""
        if len(self.rounds) < 3:
            return None
        return statistics.stdev(self.rounds) / self.median

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def measure(case: Case, peer: _peers.Peer) -> Result:
    """Run ``case`` on an open, warm ``peer``."""
    result = Result.of(case)
    assert case.build is not None
    call = case.build(peer)
    t0 = time.perf_counter()
    out = call()
    first_s = time.perf_counter() - t0
    if case.check is not None:
        case.check(out)
    del out
    for _ in range(max(0, case.warmup - 1) + (case.calls if case.kind == "latency" else 0)):
        call()  # a latency round's worth too: the first calls find caches and spinners cold
    if case.kind == "latency":
        for _ in range(case.rounds):
            lat = []
            for _ in range(case.calls):
                t0 = time.perf_counter()
                call()
                lat.append(time.perf_counter() - t0)
            result.rounds.append(statistics.median(lat))
            result.samples.extend(lat)
    else:
        # Calls shorter than ROUND_MIN_S are repeated within a round (timeit's calibration):
        # one 300 us call is at the mercy of a single scheduler tick.
        inner = max(1, min(MAX_INNER, int(ROUND_MIN_S / max(first_s, 1e-9))))
        for _ in range(case.rounds):
            t0 = time.perf_counter()
            for _ in range(inner):
                call()
            result.rounds.append((time.perf_counter() - t0) / inner)
        result.extra["calls_per_round"] = inner
    if case.memory_repeat:
        result.extra.update(peak_memory(call, case.memory_repeat))
    result.extra["start_method"] = peer.start_method
    return result


def _fresh(case: Case) -> Result:
    result = Result.of(case)
    for _ in range(case.rounds):
        if case.peer == SPAWN_REFERENCE:
            result.rounds.append(_peers.spawn_reference_s())
        else:
            result.rounds.append(_peers.fresh_process_first_result_s(case.peer, case.workers))
    return result


def _failed(case: Case, exc: BaseException) -> Result:
    result = Result.of(case)
    result.error = f"{type(exc).__name__}: {exc}".strip()
    if not isinstance(exc, (_peers.PeerUnavailable, AssertionError)):
        result.extra["traceback"] = traceback.format_exc(limit=-4)
    return result


def run(cases: list[Case], on_case: Callable[[int, int, Case], None] | None = None) -> list[Result]:
    """Measure every case; ``on_case(i, n, case)`` is called before each one (progress)."""
    order: list[tuple[str, int]] = []
    for case in cases:
        if case.kind != "fresh" and (case.peer, case.workers) not in order:
            order.append((case.peer, case.workers))
    by_case: dict[int, Result] = {}
    done = 0
    for peer_name, workers in order:
        mine = [
            (i, c)
            for i, c in enumerate(cases)
            if c.kind != "fresh" and (c.peer, c.workers) == (peer_name, workers)
        ]
        try:
            with _peers.open_peer(peer_name, workers or 1) as peer:
                for i, case in mine:
                    if on_case:
                        on_case(done, len(cases), case)
                    done += 1
                    try:
                        by_case[i] = measure(case, peer)
                    except Exception as exc:  # noqa: BLE001 - one failed row, not the whole run
                        by_case[i] = _failed(case, exc)
        except Exception as exc:  # noqa: BLE001 - the peer would not start (or not close)
            for i, case in mine:
                if i not in by_case:
                    done += 1
                    by_case[i] = _failed(case, exc)
    for i, case in enumerate(cases):
        if case.kind == "fresh":
            if on_case:
                on_case(done, len(cases), case)
            done += 1
            try:
                unavailable = None if case.peer == SPAWN_REFERENCE else _peers.available(case.peer)
                if unavailable:
                    raise _peers.PeerUnavailable(unavailable)
                by_case[i] = _fresh(case)
            except Exception as exc:  # noqa: BLE001
                by_case[i] = _failed(case, exc)
    return [by_case[i] for i in range(len(cases))]


__all__ = ["Result", "measure", "run", "IN_PROCESS"]
