"""Times the cases of scenarios.catalog() for ``python -m fastpool bench``.

    run(cases, on_case, processes, spec)
                          one Result per case. processes=1: opens each (peer, workers)
                          once here, runs its cases, closes it, then the fresh-process
                          cases. processes=N with the catalogue's spec: N rounds; in each,
                          every (peer, workers) runs its share of the rounds in a new
                          interpreter (``python -m fastpool._bench.runner SPEC``), the peers
                          one after the other, then one round of each fresh-process case.
                          So a peer's rounds come from N processes, interleaved with the
                          others': a mode a process falls into (where the scheduler put its
                          threads, say) shows as spread, not as one peer's luck.
    measure(case, peer)   warm-up call (its result checked), for short calls a round's
                          worth of warm-up whose last calls size a round, then the timed
                          rounds

Each round of a "rounds" case is one call, timed with perf_counter; a "latency" case
times every call of a round and keeps them (for the p99), the round's median being its
value; a "fresh" case starts a new interpreter per round. Memory comes from extra,
untimed calls under a MemorySampler, so its sampling thread never slows a timed one.
A peer that cannot run here, or a case that raises, gives a Result with ``error`` set,
and the run goes on.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fastpool._bench import peers as _peers
from fastpool._bench.memory import peak_memory
from fastpool._bench.scenarios import IN_PROCESS, SPAWN_REFERENCE, Case, catalog

ROUND_MIN_S = 0.02
MAX_INNER = 50
CALIBRATION_CALLS = 5  # the last warm calls size a round of short calls
MAX_WARMUP_CALLS = 500  # ...after a round's worth (ROUND_MIN_S) of them, at most this many
LATENCY_SETTLE_S = 0.5  # a round-trip row's warm-up lasts at least this long (see measure)


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
    value_unit: str = ""  # kind "value": what the rounds hold ("CPU s/s", "MiB"); else seconds

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
            value_unit=case.value_unit,
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
        if len(self.rounds) < 3 or self.median <= 0:  # a value row's figure can be 0 or less
            return None
        return statistics.stdev(self.rounds) / self.median

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def measure(case: Case, peer: _peers.Peer) -> Result:
    """Run ``case`` on an open, warm ``peer``, under its load (``case.around``) if it has one."""
    with case.around() if case.around is not None else contextlib.nullcontext():
        if case.kind == "value":
            return _values(case, peer)
        return _timed(case, peer)


def _values(case: Case, peer: _peers.Peer) -> Result:
    """A "value" case: each call returns its round's value, a number or a dict with the
    number at "value" and other figures, kept round by round in extra["per_round"]."""
    result = Result.of(case)
    assert case.build is not None
    call = case.build(peer)
    for _ in range(case.warmup):
        call()
    per_round: dict[str, list[Any]] = {}
    for _ in range(case.rounds):
        got = call()
        if isinstance(got, dict):
            got = dict(got)
            value = got.pop("value")
            for key, figure in got.items():
                per_round.setdefault(key, []).append(figure)
        else:
            value = got
        result.rounds.append(float(value))
    result.extra["per_round"] = per_round
    result.extra["start_method"] = peer.start_method
    return result


def _timed(case: Case, peer: _peers.Peer) -> Result:
    result = Result.of(case)
    assert case.build is not None
    call = case.build(peer)
    t0 = time.perf_counter()
    out = call()
    first_s = time.perf_counter() - t0
    if case.check is not None:
        case.check(out)
    del out
    if case.first:
        return _first(case, call, first_s, result, peer)
    for _ in range(max(0, case.warmup - 1) + (case.calls if case.kind == "latency" else 0)):
        call()  # a latency round's worth too: the first calls find caches and spinners cold
    if case.kind == "latency":
        # A pool just started is not yet the pool a program runs on, whoever's it is:
        # each worker's BLAS threads, started by a limit above the template's one,
        # spin-yield for OpenBLAS's thread timeout (~0.1 s), and the first tasks' memory
        # samples run in the parent.  A round timed in that wake measured it (fastpool's
        # lone worker: 7-13 us a call in such a process, 2.3-4.5 us after it).
        while time.perf_counter() - t0 < LATENCY_SETTLE_S:
            call()
        for _ in range(case.rounds):
            _latency_round(call, case.calls, result)
    else:
        # Calls shorter than ROUND_MIN_S are repeated within a round (timeit's calibration):
        # one 300 us call is at the mercy of a single scheduler tick.  First a round's worth
        # of warm-up (pyperf's warmups), then the round is sized by the last warm calls, not
        # the first: after the previous row's pause, the first few calls of a pool here
        # wait milliseconds to be scheduled (1 MiB by value: 1-4 ms for 2-7 calls, then
        # 0.2-0.3 ms), and rounds sized and run in that spell measured the wait, not the row.
        call_s = first_s
        if first_s < ROUND_MIN_S:
            warm: list[float] = []
            while len(warm) < CALIBRATION_CALLS or (
                sum(warm) < ROUND_MIN_S and len(warm) < MAX_WARMUP_CALLS
            ):
                t0 = time.perf_counter()
                call()
                warm.append(time.perf_counter() - t0)
            call_s = statistics.median(warm[-CALIBRATION_CALLS:])
        inner = max(1, min(MAX_INNER, int(ROUND_MIN_S / max(call_s, 1e-9))))
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


def _latency_round(call: Callable[[], Any], calls: int, result: Result) -> None:
    """``calls`` calls, each timed: their median is the round, all kept for the p99."""
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t0)
    result.rounds.append(statistics.median(lat))
    result.samples.extend(lat)


def _first(
    case: Case, call: Callable[[], Any], first_s: float, result: Result, peer: _peers.Peer
) -> Result:
    """A "first moments" row: the pool as a short script meets it, timed at once after the
    warm-up that saw every worker answer (open_peer), with no settle: a latency row's one
    round of ``case.calls`` calls right after its first call, a rounds row's first call."""
    if case.kind == "latency":
        _latency_round(call, case.calls, result)
    else:
        result.rounds.append(first_s)
    result.extra["start_method"] = peer.start_method
    return result


def _unavailable(case: Case) -> str | None:
    """Why a fresh case's peer cannot run here; None for a row that is no peer of
    peers.py (the spawn reference, a workload's library: its call says so itself)."""
    if case.peer == SPAWN_REFERENCE or case.peer not in _peers.ALL_PEERS:
        return None
    return _peers.available(case.peer)


def _group(case: Case) -> tuple[str, int, str]:
    """The cases of one group share a pool, in one process (a fresh one per share in run)."""
    return case.peer, case.workers, case.process_group


def _fresh(case: Case, rounds: int | None = None) -> Result:
    result = Result.of(case)
    assert case.fresh is not None, f"fresh case {case.scenario} has no call"
    for _ in range(case.rounds if rounds is None else rounds):
        result.rounds.append(case.fresh())
    result.extra["process_medians"] = list(result.rounds)
    return result


def _failed(case: Case, exc: BaseException) -> Result:
    result = Result.of(case)
    result.error = f"{type(exc).__name__}: {exc}".strip()
    if not isinstance(exc, (_peers.PeerUnavailable, AssertionError)):
        result.extra["traceback"] = traceback.format_exc(limit=-4)
    return result


def _run_here(
    cases: list[Case], on_case: Callable[[int, int, Case], None] | None = None
) -> list[Result]:
    """Measure every case in this process; ``on_case(i, n, case)`` before each (progress)."""
    order: list[tuple[str, int, str]] = []
    for case in cases:
        if case.kind != "fresh" and _group(case) not in order:
            order.append(_group(case))
    by_case: dict[int, Result] = {}
    done = 0
    for key in order:
        peer_name, workers, _ = key
        mine = [(i, c) for i, c in enumerate(cases) if c.kind != "fresh" and _group(c) == key]
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
                unavailable = _unavailable(case)
                if unavailable:
                    raise _peers.PeerUnavailable(unavailable)
                by_case[i] = _fresh(case)
            except Exception as exc:  # noqa: BLE001
                by_case[i] = _failed(case, exc)
    for i, case in enumerate(cases):
        r = by_case[i]
        if case.kind != "fresh" and r.rounds:
            r.extra["process_medians"] = [statistics.median(r.rounds)]
    return [by_case[i] for i in range(len(cases))]


def run(
    cases: list[Case],
    on_case: Callable[[int, int, Case], None] | None = None,
    processes: int = 1,
    spec: dict[str, Any] | None = None,
) -> list[Result]:
    """Measure every case; ``on_case(i, n, case)`` is called before each step (progress).

    ``processes`` > 1 needs ``spec``, the keyword arguments of scenarios.catalog() that
    made ``cases``: each new interpreter rebuilds the catalogue from it."""
    if processes <= 1 or spec is None:
        return _run_here(cases, on_case)
    groups: dict[tuple[str, int, str], list[int]] = {}
    for i, case in enumerate(cases):
        if case.kind != "fresh":
            groups.setdefault(_group(case), []).append(i)
    # A group runs in as many processes as its most limited case allows (Case.processes).
    cap = {
        key: min([processes] + [cases[i].processes or processes for i in mine])
        for key, mine in groups.items()
    }
    fresh = [i for i, c in enumerate(cases) if c.kind == "fresh"]
    fresh_cap = {i: min(cases[i].rounds, cases[i].processes or processes, processes) for i in fresh}
    merged = [Result.of(c) for c in cases]
    for r in merged:
        r.extra["process_medians"] = []
    steps = sum(cap.values()) + sum(fresh_cap.values())
    done = 0
    for share in range(processes):
        for key, mine in groups.items():
            if share >= cap[key]:
                continue
            if on_case:
                on_case(done, steps, cases[mine[0]])
            done += 1
            share_of = {i: cases[i] for i in mine}
            for i, got in _in_new_process(spec, share, cap[key], share_of).items():
                _merge(merged[i], got)
        for i in fresh:
            case = cases[i]
            if share >= fresh_cap[i]:
                continue  # fewer rounds (or processes) than the run's: the first ones only
            if on_case:
                on_case(done, steps, case)
            done += 1
            try:
                unavailable = _unavailable(case)
                if unavailable:
                    raise _peers.PeerUnavailable(unavailable)
                _merge(merged[i], _fresh(case, 1))
            except Exception as exc:  # noqa: BLE001
                _merge(merged[i], _failed(case, exc))
    for r in merged:
        r.extra["processes"] = len(r.extra["process_medians"])
    return merged


def _merge(into: Result, got: Result) -> None:
    if got.error:
        into.error = into.error or got.error
        if "traceback" in got.extra:
            into.extra.setdefault("traceback", got.extra["traceback"])
        return
    into.rounds.extend(got.rounds)
    into.samples.extend(got.samples)
    medians = into.extra["process_medians"]
    for key, value in got.extra.items():
        if key == "per_round":  # a value case's other figures, round by round: all of them
            mine = into.extra.setdefault("per_round", {})
            for name, figures in value.items():
                mine.setdefault(name, []).extend(figures)
        elif key != "process_medians" and key not in into.extra:
            into.extra[key] = value
    if got.rounds:
        medians.append(statistics.median(got.rounds))


def _in_new_process(
    spec: dict[str, Any], share: int, of: int, mine: dict[int, Case]
) -> dict[int, Result]:
    """The cases ``mine`` (index: case) of one (peer, workers), run in a new interpreter:
    share ``share`` of ``of`` of each case's rounds. A process that fails fails each one."""
    first = next(iter(mine.values()))
    order = {**spec, "peer": first.peer, "workers_of_group": first.workers}
    order["process_group"] = first.process_group
    order.update(share=share, of=of)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fastpool._bench.runner", json.dumps(order)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bench process failed ({done.returncode}):\n{done.stderr[-2000:]}")
        data = json.loads(done.stdout.strip().splitlines()[-1])
        return {int(i): Result.from_dict(d) for i, d in data.items()}
    except Exception as exc:  # noqa: BLE001 - the rows of this process fail, the run goes on
        return {i: _failed(case, exc) for i, case in mine.items()}


def _child(order: dict[str, Any]) -> None:
    """One process's share (``python -m fastpool._bench.runner ORDER``): prints a JSON line
    {case index: Result}."""
    group = (order.pop("peer"), order.pop("workers_of_group"), order.pop("process_group"))
    share, of = order.pop("share"), order.pop("of")
    cases = catalog(**order)  # what is left is the spec the parent's catalogue was made from
    mine = {i: c for i, c in enumerate(cases) if c.kind != "fresh" and _group(c) == group}
    for case in mine.values():
        case.rounds = max(1, math.ceil(case.rounds / of))
        if share:
            case.memory_repeat = 0  # sampled in the first process only
    results = _run_here(list(mine.values()))
    print(json.dumps({i: r.to_dict() for i, r in zip(mine, results)}))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))


__all__ = ["Result", "measure", "run", "IN_PROCESS"]
