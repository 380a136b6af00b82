"""The standard scenarios: what each one times, on which peers, at which sizes.

One catalogue for both harnesses: ``python -m fastpool bench`` runs ``catalog()``
with its own timer (fastpool/_bench/runner.py); benchmarks/test_bench_*.py build the
same calls with ``round_trip``, ``submit_many``, ``map_small`` and ``array_call`` and
time them with pytest-benchmark. Group titles are shared too, so a row means the
same thing in both reports.

    hop         no-op round trip: submit one task, wait for it, repeat (1 and 2 workers)
    submits     SUBMITS no-op tasks, each through its own submit, then wait for all
    map         map over MAP_ITEMS small ints, each peer at each of CHUNKSIZES (best kept)
    arrays      float64 arrays of SIZES_MIB, one way (a float back) and round trip (an
                array as large back), by value on every peer, fastpool's shared idioms
                ([share], [empty] and [arrays] both ways, [fill]) as rows of their own, and
                the compute alone in this process, on NumPy's own array and on one in
                shared memory ([shared pages]: 4 KiB pages where shmem gets no huge pages,
                the floor of every shared idiom)
    start       a fresh interpreter that imported numpy: from the pool library's import to
                its first result, and a plain multiprocessing spawn of a child importing
                numpy, for scale;
                ``import fastpool`` after numpy; a cold pool of BURST_WORKERS running
                BURST_TASKS sleeps of BURST_TASK_S (start plus ramp)

    contention  (contention.py, ``section="contention"``) the load the bench makes itself:
                CPU hogs, three programs at once, an oversubscribed pool, a CPU-bound map;
                the idle cost of pools of 2, 8 and 16; a batch's peak and held memory

Rows of kind "rounds" and "latency" run in fresh processes, several per peer, the peers
interleaved (runner.run); each process gives one median, and the report shows their spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from fastpool._bench import peers as _peers
from fastpool._bench import tasks
from fastpool._bench.peers import ARRAY_PEERS, TASK_PEERS, Peer

SUBMITS = 20_000
MAP_ITEMS = 200_000
CHUNKSIZES = (1000, 5000, 20000)
SIZES_MIB = (1, 16, 256)
LATENCY_CALLS = 5000
START_WORKERS = 2
BURST_WORKERS = 4
BURST_TASKS = 40
BURST_TASK_S = 0.1
# peers whose map has a default chunk size worth a row: PPE and loky default to 1 item
DEFAULT_CHUNK_PEERS = ("fastpool", "mp.Pool")
# --quick: the quiet section alone, 2 processes per peer, the round trip with 2 workers only,
# arrays of 16 MiB only, no cold-pool bursts: about 30 s on two cores (see --quick's help)
QUICK_SUBMITS = 1_000
QUICK_MAP_ITEMS = 20_000
QUICK_CHUNKSIZES = (1000, 5000)
QUICK_SIZES_MIB = (16,)
QUICK_LATENCY_CALLS = 600

FIRST = ", first moments (right after the pool's first results, no settle)"

IN_PROCESS = "in-process"
SPAWN_REFERENCE = "mp spawn + import numpy"
IDIOMS = {
    "one way": ("share", "empty", "arrays"),
    "round trip": ("share", "empty", "arrays", "fill"),
}
SHARED_PAGES = "shared pages"  # the in-process reference on an array in a shared-memory arena


# ---- group titles (shared with benchmarks/report.py's tables) ---------------------------


def hop_group(workers: int) -> str:
    return f"hop: no-op round trip, {workers} worker{'s' if workers > 1 else ''}"


def submits_group(n: int, workers: int) -> str:
    return f"throughput: {n:,} submits then wait, {workers} workers"


def map_group(n: int, workers: int) -> str:
    return f"throughput: map over {n:,} small items, {workers} workers"


def one_way_group(mib: int) -> str:
    return f"arrays one way: {mib} MiB in, float out"


def round_trip_group(mib: int) -> str:
    return f"arrays round trip: {mib} MiB in, {mib} MiB out"


def start_group(workers: int) -> str:
    return f"start: import to first result, fresh process with numpy, {workers} workers"


def import_group() -> str:
    return "start: import fastpool after numpy, fresh interpreter"


def burst_group(workers: int, n: int, seconds: float) -> str:
    return f"start: cold pool of {workers}, {n} tasks of {seconds:g} s (start plus ramp)"


# ---- the calls ----------------------------------------------------------------------------


def round_trip(peer: Peer) -> Callable[[], None]:
    def call() -> None:
        return peer.submit(tasks.noop).result()

    return call


def submit_many(peer: Peer, n: int) -> Callable[[], int]:
    def call() -> int:
        futures = [peer.submit(tasks.noop) for _ in range(n)]
        for f in futures:
            f.result()
        return len(futures)

    return call


def map_small(peer: Peer, items: list[int], chunksize: int | None) -> Callable[[], list]:
    def call() -> list:
        return peer.map(tasks.square, items, chunksize)

    return call


def check_map(result: list, n: int) -> None:
    assert len(result) == n and result[-1] == (n - 1) ** 2, "map returned wrong results"


def make_array(mib: int) -> Any:
    import numpy as np

    return np.arange(mib * 2**20 // 8, dtype=np.float64)


def check_total(got: float, arr: Any) -> None:
    assert math.isclose(got, float(arr.sum())), f"sum {got} != {float(arr.sum())}"


def check_doubled(out: Any, arr: Any) -> None:
    assert out.shape == arr.shape
    for i in (0, 1, arr.size // 2, arr.size - 1):
        assert out[i] == 2 * arr[i], f"element {i}: {out[i]} != 2 * {arr[i]}"


def array_call(peer: Peer, direction: str, idiom: str, arr: Any) -> Callable[[], Any]:
    """The timed call of one array row. ``direction`` is "one way" or "round trip";
    ``idiom`` "" (by value, any peer) or one of fastpool's: "share" (``pool.share``
    inside the call), "empty" (input filled into ``pool.empty`` once, outside it; a
    round trip's new array comes back as it is when the worker made it in shared memory),
    "fill" (the worker writes ``out = pool.empty(...)``, allocated inside it), "arrays"
    (input made by NumPy within ``pool.arrays()`` once, outside it); for the in-process
    peer, SHARED_PAGES (the compute on a copy in a shared-memory arena of its own).
    Set-up the call does not time happens here, before it is returned."""
    fn = tasks.total if direction == "one way" else tasks.double
    if idiom == SHARED_PAGES:
        from fastpool._native import _arena, _ndarray

        held = _arena.Arena.create(1, 2 * arr.nbytes + (16 << 20))
        src = _ndarray.share(held, arr)

        def call() -> Any:
            return peer.submit(fn, src).result()

        return call
    if not idiom:

        def call() -> Any:
            return peer.submit(fn, arr).result()

        return call
    pool = peer.pool  # type: ignore[attr-defined]  # fastpool's idioms: FastpoolPeer only
    if idiom == "share":

        def call() -> Any:
            return pool.submit(fn, pool.share(arr, readonly=True)).result()

        return call
    if idiom == "arrays":
        import numpy as np

        with pool.arrays():
            born = np.array(arr)  # NumPy's own allocation, in the pool's shared memory

        def call() -> Any:
            return pool.submit(fn, born).result()

        return call
    src = pool.empty(arr.shape, arr.dtype)
    src[...] = arr
    if idiom == "empty":

        def call() -> Any:
            return pool.submit(fn, src).result()

        return call
    if idiom == "fill":

        def call() -> Any:
            out = pool.empty(arr.shape, arr.dtype)
            assert pool.submit(tasks.fill_double, src, out, 0, arr.size).result() == arr.size
            return out  # the worker's writes are visible here, or it is no idiom

        return call
    raise ValueError(f"unknown idiom {idiom!r}")


# ---- the catalogue for the command --------------------------------------------------------


@dataclass
class Case:
    """One row to measure: a peer (and setting) in a scenario."""

    scenario: str  # stable id: "hop-2w", "arrays-round-trip-16"
    group: str  # the table title the row appears under
    peer: str
    variant: str = ""  # a swept setting ("chunksize=5000") or a fastpool idiom
    idiom: bool = False  # True: the variant is its own row; False: best one kept
    workers: int = 2
    kind: str = "rounds"  # "rounds" | "latency" | "fresh" | "value" (the call returns it)
    build: Callable[[Peer], Callable[[], Any]] | None = None
    check: Callable[[Any], None] | None = None
    ops: float = 1.0  # per call, for the throughput column
    unit: str = "calls/s"  # the throughput column's unit
    rounds: int = 5
    warmup: int = 1
    calls: int = 0  # latency: calls per round
    memory_repeat: int = 0  # > 0: also sample peak memory over this many calls
    fresh: Callable[[], float] | None = None  # kind "fresh": one round, in a new interpreter
    extra: dict[str, Any] = field(default_factory=dict)
    # The load a row runs under (contention.py): entered after the peer is warm, around the
    # warm-up and the rounds; None: the machine as it is.
    around: Callable[[], AbstractContextManager[Any]] | None = None
    # Rows of one (peer, workers, process_group) share a fresh process (runner.run); the
    # contention rows have their own, so no quiet row's state (an arena grown by 256 MiB
    # arrays) is in them. processes: at most this many such processes (seconds per row).
    process_group: str = ""
    processes: int | None = None
    value_unit: str = ""  # kind "value": what the rounds hold ("CPU s/s", "MiB")
    # "first moments": timed at once after its pool's warm-up, no settle, one round a
    # process (runner._first); the first row of its process group, so its pool is fresh
    first: bool = False

    @property
    def label(self) -> str:
        return f"{self.peer} [{self.variant}]" if self.idiom else self.peer

    @property
    def key(self) -> tuple[str, str]:
        """Rows of one (scenario, label) are variants of the same thing; the fastest is shown."""
        return self.scenario, self.label


def _hop(peers: list[str], workers: int, calls: int, rounds: int) -> list[Case]:
    """The round trip at both moments: right after the pool's first results (FIRST, one
    round in each fresh process, the first row of each) and settled."""
    cases = []
    for p in peers:
        if p not in TASK_PEERS:
            continue
        for first in (True, False):
            cases.append(
                Case(
                    f"hop-{workers}w" + ("-first" if first else ""),
                    hop_group(workers) + (FIRST if first else ""),
                    p,
                    workers=workers,
                    kind="latency",
                    build=round_trip,
                    rounds=1 if first else rounds,
                    calls=calls // rounds,
                    first=first,
                )
            )
    return cases


def _submits_first(peers: list[str], workers: int, submits: int) -> list[Case]:
    """The submits row right after the pool's first results: a process group of its own,
    so that its pool has run nothing but the warm-up."""
    return [
        Case(
            "submits-first",
            submits_group(submits, workers) + FIRST,
            p,
            workers=workers,
            build=lambda peer, n=submits: submit_many(peer, n),
            check=lambda got, n=submits: _expect(got, n),
            ops=submits,
            unit="tasks/s",
            rounds=1,
            first=True,
            process_group="first",
        )
        for p in peers
        if p in TASK_PEERS
    ]


def _throughput(
    peers: list[str],
    workers: int,
    submits: int,
    items: int,
    chunksizes: tuple[int, ...],
    rounds: int,
) -> list[Case]:
    cases = [
        Case(
            "submits",
            submits_group(submits, workers),
            p,
            workers=workers,
            build=lambda peer, n=submits: submit_many(peer, n),
            check=lambda got, n=submits: _expect(got, n),
            ops=submits,
            unit="tasks/s",
            rounds=3,
        )
        for p in peers
        if p in TASK_PEERS
    ]
    data = list(range(items))
    for p in peers:
        if p not in TASK_PEERS:
            continue
        for cs in chunksizes:
            cases.append(
                Case(
                    "map",
                    map_group(items, workers),
                    p,
                    variant=f"chunksize={cs or 'auto'}",
                    workers=workers,
                    build=lambda peer, cs=cs: map_small(peer, data, cs),
                    check=lambda got, n=items: check_map(got, n),
                    ops=items,
                    unit="items/s",
                    rounds=rounds,
                )
            )
        if p in DEFAULT_CHUNK_PEERS:
            cases.append(
                Case(
                    "map",
                    map_group(items, workers),
                    p,
                    variant="default chunksize",
                    idiom=True,
                    workers=workers,
                    build=lambda peer: map_small(peer, data, None),
                    check=lambda got, n=items: check_map(got, n),
                    ops=items,
                    unit="items/s",
                    rounds=rounds,
                )
            )
    return cases


def _arrays(peers: list[str], workers: int, sizes: tuple[int, ...], quick: bool) -> list[Case]:
    cases: list[Case] = []
    rounds = {1: 10, 16: 5, 256: 3} if not quick else {1: 5, 16: 3}
    repeat = {1: 10, 16: 2, 256: 1}  # a 1 MiB call can finish between two memory samples
    for mib in sizes:
        arr_box: dict[str, Any] = {}

        def arr(mib: int = mib, box: dict[str, Any] = arr_box) -> Any:
            if "arr" not in box:  # made once, when the first row of this size runs
                box["arr"] = make_array(mib)
            return box["arr"]

        for direction, group in (
            ("one way", one_way_group(mib)),
            ("round trip", round_trip_group(mib)),
        ):
            moved = (1 if direction == "one way" else 2) * mib * 2**20 / 1e9
            check = (
                (lambda got, a=arr: check_total(got, a()))
                if direction == "one way"
                else (lambda got, a=arr: check_doubled(got, a()))
            )
            rows = [(p, "") for p in [*peers, IN_PROCESS] if p in ARRAY_PEERS or p == IN_PROCESS]
            if "fastpool" in peers:
                rows += [("fastpool", idiom) for idiom in IDIOMS[direction]]
                rows.append((IN_PROCESS, SHARED_PAGES))
            for p, idiom in rows:
                cases.append(
                    Case(
                        f"arrays-{direction.replace(' ', '-')}-{mib}",
                        group,
                        p,
                        variant=idiom,
                        idiom=bool(idiom),
                        workers=0 if p == IN_PROCESS else workers,
                        build=lambda peer, d=direction, i=idiom, a=arr: array_call(peer, d, i, a()),
                        check=check,
                        ops=moved,
                        unit="GB/s",
                        rounds=rounds[mib],
                        memory_repeat=repeat[mib],
                        extra={"mib": mib},
                    )
                )
    return cases


def _start(peers: list[str], workers: int, runs: int, burst_runs: int) -> list[Case]:
    group = start_group(workers)
    cases = [
        Case(
            "start",
            group,
            p,
            workers=workers,
            kind="fresh",
            rounds=runs,
            warmup=0,
            fresh=lambda p=p: _peers.fresh_process_first_result_s(p, workers),
        )
        for p in peers
        if p in TASK_PEERS
    ]
    cases.append(
        Case(
            "start",
            group,
            SPAWN_REFERENCE,
            workers=1,
            kind="fresh",
            rounds=runs,
            warmup=0,
            fresh=_peers.spawn_reference_s,
        )
    )
    if "fastpool" in peers:
        cases.append(
            Case(
                "import",
                import_group(),
                "fastpool",
                workers=0,
                kind="fresh",
                rounds=max(3, runs),
                warmup=0,
                fresh=_peers.import_after_numpy_s,
            )
        )
    cases += [
        Case(
            "burst",
            burst_group(BURST_WORKERS, BURST_TASKS, BURST_TASK_S),
            p,
            workers=BURST_WORKERS,
            kind="fresh",
            rounds=burst_runs,
            warmup=0,
            ops=BURST_TASKS,
            unit="tasks/s",
            fresh=lambda p=p: _peers.fresh_process_burst_s(
                p, BURST_WORKERS, BURST_TASKS, BURST_TASK_S
            ),
        )
        for p in peers
        if p in TASK_PEERS and burst_runs
    ]
    return cases


def _expect(got: Any, want: Any) -> None:
    assert got == want, f"got {got!r}, expected {want!r}"


SECTIONS = ("all", "quiet", "contention", "workloads")


def catalog(
    peers: list[str],
    quick: bool = False,
    only: str | None = None,
    workers: int = START_WORKERS,
    section: str = "all",
    batch_mib: int | None = None,
) -> list[Case]:
    """Every case to run for ``peers`` (names as in PEERS), in running order.

    ``workers``: the pool size of every scenario but the 1-worker hop and the contention rows.
    ``section``: "quiet" (the machine as it is), "contention" (contention.py: the load the
    bench makes itself, idle cost and a batch's memory), "workloads" (workloads.py: batch
    jobs as each library's users write them, every library installed) or "all": quiet,
    contention, workloads.
    ``batch_mib``: the contention batch's array (default: contention.batch_mib()).
    ``only``: keep the scenarios whose id contains one of its comma-separated words."""
    if section not in SECTIONS:
        raise ValueError(f"section {section!r}: one of {', '.join(SECTIONS)}")
    peers = [p for p in peers if p != IN_PROCESS]  # it joins the array rows by itself
    cases = _quiet(peers, quick, workers) if section in ("all", "quiet") else []
    if section in ("all", "contention"):
        from fastpool._bench import contention  # it builds on this module's Case and calls

        cases += contention.cases(peers, quick, batch_mib)
    if section in ("all", "workloads"):
        from fastpool._bench import workloads

        cases += workloads.cases("quick" if quick else "full", workers)
    if only:
        words = [w.strip() for w in only.split(",") if w.strip()]
        cases = [c for c in cases if any(w in c.scenario for w in words)]
    return cases


def _quiet(peers: list[str], quick: bool, workers: int) -> list[Case]:
    hops = sorted({1, workers})
    if quick:  # the round trip at the run's pool size only: a process less per peer
        cases = _hop(peers, workers, QUICK_LATENCY_CALLS, 3)
        cases += _submits_first(peers, workers, QUICK_SUBMITS)
        cases += _throughput(peers, workers, QUICK_SUBMITS, QUICK_MAP_ITEMS, QUICK_CHUNKSIZES, 3)
        cases += _arrays(peers, workers, QUICK_SIZES_MIB, True) + _start(peers, workers, 1, 0)
    else:
        cases = [c for w in hops for c in _hop(peers, w, LATENCY_CALLS, 10)]
        cases += _submits_first(peers, workers, SUBMITS)
        cases += _throughput(peers, workers, SUBMITS, MAP_ITEMS, CHUNKSIZES, 5)
        # a first pool's start varies by a tenth from one process to the next on a busy
        # machine: 10 processes (as many as the rounds rows), the bursts (seconds each) 3
        cases += _arrays(peers, workers, SIZES_MIB, False) + _start(peers, workers, 10, 3)
    return cases
