"""Peers behind one adapter, process bookkeeping, and measurement helpers.

Shared by ``python -m fastpool bench`` (fastpool/cli/bench.py) and the developer's
pytest-benchmark suite (benchmarks/_peers.py re-exports this module and turns
``PeerUnavailable`` into a skip).

    PEERS[name](workers)   construct the executor (no warm-up: the start benchmarks time this)
    peer.warm()            run tasks until every worker has answered and imported numpy
    peer.submit(fn, *a)    -> object with .result(timeout=None)
    peer.map(fn, items, chunksize) -> list, ordered; chunksize=None is the peer's default
    peer.map_iter(...)     the library's own map as a user iterates it (lazy or a list)
    peer.close()           shut down and join the workers
    open_peer(name, n)     context manager: construct, warm, always close, reap leftovers
    (memory.py: MemorySampler and peak_memory, the PSS of this process and its workers)
    KEYS                   the command line's short names: mp, ppe, loky, joblib, serial

``in-process`` is a peer too: the same call run in this process, the compute alone,
for the rows that compare a pool's hop with the work it carries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import subprocess
import sys
import threading
import time
import warnings

import psutil

from fastpool._bench import tasks as _tasks

DEFAULT_WORKERS = 2  # the project's machines have 2 cores; more would time the scheduler
# Generous for a healthy pool (warm-up takes well under a second, shutdown too), short
# enough that a pool that hangs costs the suite seconds, not its whole time budget.
WARM_TIMEOUT_S = 20.0
REAP_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 15.0
# Peers whose shutdown never returned: conftest ends the run with os._exit, since the
# interpreter would otherwise hang at exit joining that pool's threads.
ABANDONED: list[str] = []

# Children that outlive one executor by design, shared by every pool of a session:
# trackers, and the servers workers are forked from (fastpool's template is one per
# parent process, like multiprocessing's forkserver).
_INFRA_MARKERS = (
    "resource_tracker",
    "semaphore_tracker",
    "forkserver",
    "fastpool._runtime._template",
)


class PeerUnavailable(ImportError):
    """The peer's package is not installed (or fastpool's core is not built)."""


class _Done:
    """A result that is already there (joblib has no futures)."""

    __slots__ = ("_value",)

    def __init__(self, value):
        self._value = value

    def result(self, timeout=None):
        return self._value


class _Async:
    """multiprocessing.pool.AsyncResult spelled like a Future."""

    __slots__ = ("_ar",)

    def __init__(self, ar):
        self._ar = ar

    def result(self, timeout=None):
        return self._ar.get(timeout)


class Peer:
    """One executor behind the interface every benchmark uses."""

    name = ""
    arrays_only = False  # joblib only takes part in the array benchmarks

    def __init__(self, workers: int) -> None:
        self.workers = workers

    @staticmethod
    def require() -> None:
        """Raise PeerUnavailable, naming what to install, when this peer cannot be imported."""

    @property
    def start_method(self) -> str:
        return multiprocessing.get_start_method()

    def submit(self, fn, *args):
        raise NotImplementedError

    def map(self, fn, items, chunksize=None) -> list:
        raise NotImplementedError

    def map_iter(self, fn, items, chunksize=None):
        """The peer's own map, iterated as a user would: lazy where the library's map is
        (fastpool, the executors), a list where it is not (multiprocessing.Pool)."""
        return iter(self.map(fn, items, chunksize))

    def close(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """Worker states for an error message; empty where the peer exposes none."""
        return ""

    def _pids(self, n_tasks: int, delay_s: float) -> set[int]:
        futures = [self.submit(_tasks.warm, delay_s) for _ in range(n_tasks)]
        return {f.result(timeout=WARM_TIMEOUT_S) for f in futures}

    def warm(self) -> None:
        # Until every worker has answered a task: a spawned worker still starting up
        # would otherwise be timed in the first rounds. The sleep spreads the tasks.
        deadline = time.monotonic() + WARM_TIMEOUT_S
        seen: set[int] = set()
        while len(seen) < self.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name}: only {len(seen)}/{self.workers} workers answered a task "
                    f"within {WARM_TIMEOUT_S:.0f} s {self.describe()}"
                )
            seen |= self._pids(2 * self.workers, 0.02)
        assert self.map(_tasks.square, list(range(64)), 8)[-1] == 63 * 63


class FastpoolPeer(Peer):
    name = "fastpool"

    @staticmethod
    def require() -> None:
        import fastpool

        if fastpool.CORE_ERROR is not None:
            raise PeerUnavailable(fastpool.CORE_ERROR)

    def __init__(self, workers: int) -> None:
        import fastpool

        super().__init__(workers)
        self.pool = fastpool.Pool(workers=workers)

    @property
    def start_method(self) -> str:
        # fastpool forks workers from its template process (fastpool/_runtime/_template.py)
        return "template" if "fastpool._runtime._template" in sys.modules else "?"

    def describe(self) -> str:
        with contextlib.suppress(Exception):
            workers = self.pool.stats()["workers"]
            return "; workers: " + ", ".join(f"{w.get('pid')} {w.get('state')}" for w in workers)
        return ""

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    def map(self, fn, items, chunksize=None) -> list:
        return list(self.pool.map(fn, items, chunksize=chunksize))

    def map_iter(self, fn, items, chunksize=None):
        return self.pool.map(fn, items, chunksize=chunksize)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class MpPoolPeer(Peer):
    name = "mp.Pool"

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.pool = multiprocessing.Pool(workers)

    def submit(self, fn, *args):
        return _Async(self.pool.apply_async(fn, args))

    def map(self, fn, items, chunksize=None) -> list:
        return self.pool.map(fn, items, chunksize)

    def close(self) -> None:
        # Graceful: every result is in by now, so the workers just read their
        # sentinel and exit. (Neither this nor terminate() returns if a worker died
        # idle: it dies holding the task queue's read lock, which both then wait on.)
        self.pool.close()
        self.pool.join()


class _ExecutorPeer(Peer):
    """A concurrent.futures.Executor in ``self.pool``: submit and map as the standard says."""

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    def map(self, fn, items, chunksize=None) -> list:
        return list(self.pool.map(fn, items, chunksize=chunksize or 1))

    def map_iter(self, fn, items, chunksize=None):
        return self.pool.map(fn, items, chunksize=chunksize or 1)


class PpePeer(_ExecutorPeer):
    name = "PPE"

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers)

    @property
    def start_method(self) -> str:
        return self.pool._mp_context.get_start_method()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class LokyPeer(_ExecutorPeer):
    name = "loky"

    @staticmethod
    def require() -> None:
        _importable("loky")

    def __init__(self, workers: int) -> None:
        import loky

        super().__init__(workers)
        # timeout: loky's default (10 s) retires idle workers, and a benchmark that
        # then pays for a respawn would be measuring something else.
        self.pool = loky.get_reusable_executor(max_workers=workers, timeout=600)

    @property
    def start_method(self) -> str:
        return "loky"

    def close(self) -> None:
        # kill_workers: otherwise the reusable executor keeps them for the next caller.
        self.pool.shutdown(wait=True, kill_workers=True)


class JoblibPeer(Peer):
    """joblib.Parallel on its loky backend, with its automatic memmapping of arrays
    over ``max_nbytes`` (1M). The Parallel object stays entered, so its workers and
    its memmap folder survive from call to call, the way joblib is meant to be used."""

    name = "joblib"
    arrays_only = True

    @staticmethod
    def require() -> None:
        _importable("joblib")

    def __init__(self, workers: int) -> None:
        import joblib

        super().__init__(workers)
        self._delayed = joblib.delayed
        self.parallel = joblib.Parallel(
            n_jobs=workers, backend="loky", max_nbytes="1M", mmap_mode="r"
        )
        self.parallel.__enter__()

    @property
    def start_method(self) -> str:
        return "loky"

    def submit(self, fn, *args):
        return _Done(self.parallel([self._delayed(fn)(*args)])[0])

    def map(self, fn, items, chunksize=None) -> list:
        return self.parallel(self._delayed(fn)(x) for x in items)

    def _pids(self, n_tasks: int, delay_s: float) -> set[int]:
        return set(self.parallel(self._delayed(_tasks.warm)(delay_s) for _ in range(n_tasks)))

    def close(self) -> None:
        executor = getattr(self.parallel._backend, "_workers", None)
        self.parallel.__exit__(None, None, None)
        if executor is not None:
            executor.shutdown(wait=True, kill_workers=True)


class InProcessPeer(Peer):
    """No pool: each call runs here, at once. The compute alone, for reference rows."""

    name = "in-process"
    arrays_only = True

    def __init__(self, workers: int = 0) -> None:
        super().__init__(workers)

    @property
    def start_method(self) -> str:
        return "-"

    def submit(self, fn, *args):
        return _Done(fn(*args))

    def map(self, fn, items, chunksize=None) -> list:
        return [fn(x) for x in items]

    def warm(self) -> None:
        _tasks.warm(0.0)

    def close(self) -> None:
        pass


def _importable(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise PeerUnavailable(
            f"{module} is not installed (pip install {module}, or pip install 'fastpool[bench]')"
        )


PEERS: dict[str, type[Peer]] = {
    cls.name: cls for cls in (FastpoolPeer, MpPoolPeer, PpePeer, LokyPeer, JoblibPeer)
}
TASK_PEERS = [name for name, cls in PEERS.items() if not cls.arrays_only]
ARRAY_PEERS = list(PEERS)
# The command line's names for the peers (--peers mp,ppe,loky,joblib).
KEYS = {
    "fastpool": "fastpool",
    "mp": "mp.Pool",
    "ppe": "PPE",
    "loky": "loky",
    "joblib": "joblib",
    "serial": "in-process",
}
ALL_PEERS: dict[str, type[Peer]] = {**PEERS, InProcessPeer.name: InProcessPeer}


def available(name: str) -> str | None:
    """None when peer ``name`` can run here, else why not."""
    try:
        ALL_PEERS[name].require()
    except PeerUnavailable as exc:
        return str(exc)
    return None


# --- processes ---------------------------------------------------------------------------


def _is_infra(proc: psutil.Process, my_cmdline: list[str]) -> bool:
    try:
        cmdline = proc.cmdline()
        if cmdline == my_cmdline:
            return False  # forked from this process: a worker
        joined = " ".join(cmdline)
        if not any(marker in joined for marker in _INFRA_MARKERS):
            return False
        # A fork server's workers are forks of it, with its command line: only the
        # server itself (whose parent has another command line) is infrastructure.
        return proc.parent().cmdline() != cmdline
    except psutil.Error:
        return True  # already gone


def _fastpool_template_pid() -> int | None:
    """fastpool's worker template lives as long as this process (it may be a fork of
    it, with the same command line): infrastructure, like a fork server."""
    mod = sys.modules.get("fastpool._runtime._template")
    return mod.template().pid if mod is not None else None


def worker_processes() -> list[psutil.Process]:
    """Descendants of this process, minus the trackers and fork servers that
    outlive any one executor."""
    me = psutil.Process()
    my_cmdline = me.cmdline()
    template = _fastpool_template_pid()
    return [
        p for p in me.children(recursive=True) if p.pid != template and not _is_infra(p, my_cmdline)
    ]


def reap(procs: list[psutil.Process], who: str) -> None:
    """Wait for ``procs`` to exit; kill, and warn about, the ones that do not."""
    _gone, alive = psutil.wait_procs(procs, timeout=REAP_TIMEOUT_S)
    if not alive:
        return
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=REAP_TIMEOUT_S)
    warnings.warn(
        f"{who} left {len(alive)} process(es) running after shutdown: "
        f"{sorted(p.pid for p in alive)} (killed)",
        stacklevel=2,
    )


def close_peer(peer: Peer, before: set[int]) -> None:
    """Shut ``peer`` down, then reap every worker process not in ``before``.

    shutdown() runs in a thread with a deadline: a pool that hangs in shutdown
    (a bug the benchmarks can trigger, by killing workers) gets its workers killed
    and a warning, instead of hanging the whole suite."""
    # Listed before close(): a worker that exits during close() is simply gone.
    spawned = [p for p in worker_processes() if p.pid not in before]
    failure: list[BaseException] = []

    def close() -> None:
        try:
            peer.close()
        except BaseException as exc:  # re-raised on the caller's thread
            failure.append(exc)

    closer = threading.Thread(target=close, name=f"close-{peer.name}", daemon=True)
    closer.start()
    closer.join(CLOSE_TIMEOUT_S)
    if closer.is_alive():
        warnings.warn(
            f"{peer.name}: shutdown did not return within {CLOSE_TIMEOUT_S:.0f} s; "
            "killing its workers",
            stacklevel=2,
        )
        for proc in spawned:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        closer.join(CLOSE_TIMEOUT_S)
        if closer.is_alive():
            ABANDONED.append(peer.name)
            warnings.warn(f"{peer.name}: shutdown still blocked; abandoned", stacklevel=2)
    reap(spawned, peer.name)
    if failure:
        raise failure[0]


@contextlib.contextmanager
def open_peer(name: str, workers: int = DEFAULT_WORKERS, warm: bool = True, peers=None):
    """A constructed (and warmed) peer that is always shut down, leftovers killed.

    ``peers`` maps names to classes (default ALL_PEERS); require() raises PeerUnavailable."""
    cls = (ALL_PEERS if peers is None else peers)[name]
    cls.require()
    before = {p.pid for p in worker_processes()}
    peer = cls(workers)
    try:
        if warm:
            peer.warm()
        yield peer
    finally:
        close_peer(peer, before)


def _fresh_python(code: str, *args: str) -> float:
    """Run ``code`` in a new interpreter; it prints seconds as its last word."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"fresh-process run failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


# A first pool as a script meets it, one fresh interpreter per peer: NumPy is imported,
# then the clock runs from the pool library's own import (fastpool's lazy Pool import,
# multiprocessing's pool module, loky) to the first result, a worker's import of NumPy.
# The task is a builtin (eval) so that no module of ours is imported before the clock.
_NUMPY_EXPR = "__import__('numpy').__version__"
_FIRST_POOL: dict[str, tuple[str, str]] = {  # peer: (import to first result, shutdown)
    "fastpool": (
        "import fastpool\np = fastpool.Pool({w})\nr = p.submit(eval, X).result()",
        "p.shutdown()",
    ),
    "mp.Pool": (
        "import multiprocessing\np = multiprocessing.Pool({w})\n"
        "r = p.apply_async(eval, (X,)).get()",
        "p.close(); p.join()",
    ),
    "PPE": (
        "from concurrent.futures import ProcessPoolExecutor\n"
        "p = ProcessPoolExecutor({w})\nr = p.submit(eval, X).result()",
        "p.shutdown()",
    ),
    "loky": (
        "import loky\np = loky.get_reusable_executor(max_workers={w}, timeout=600)\n"
        "r = p.submit(eval, X).result()",
        "p.shutdown(kill_workers=True)",
    ),
}


def fresh_process_first_result_s(name: str, workers: int = DEFAULT_WORKERS) -> float:
    """Seconds from importing peer ``name``'s library to its first result, in a new
    interpreter that has imported numpy: the first pool of a program, which pays for
    its imports and whatever a pool starts once per process (fastpool's template,
    loky's resource tracker).  Shutdown is not counted."""
    body, close = _FIRST_POOL[name]
    lines = ["t0 = time.perf_counter()", body.format(w=workers), "t = time.perf_counter() - t0"]
    lines += [close, "assert r == numpy.__version__, r", "print(t)"]
    code = f"import time, numpy\nX = {_NUMPY_EXPR!r}\nif __name__ == '__main__':\n" + "\n".join(
        "    " + line for text in lines for line in text.split("\n")
    )
    return _fresh_python(code)


def burst_s(name: str, workers: int, tasks: int, seconds: float) -> float:
    """Seconds from constructing peer ``name`` (``workers`` of them) to the last result of
    ``tasks`` sleeps of ``seconds`` submitted at once: start plus ramp (shutdown not counted)."""
    cls = ALL_PEERS[name]
    t0 = time.perf_counter()
    peer = cls(workers)
    try:
        futures = [peer.submit(_tasks.warm, seconds) for _ in range(tasks)]
        for f in futures:
            f.result(timeout=WARM_TIMEOUT_S + tasks * seconds)
        return time.perf_counter() - t0
    finally:
        peer.close()


def fresh_process_burst_s(name: str, workers: int, tasks: int, seconds: float) -> float:
    """burst_s in a new interpreter that has imported numpy: a cold pool's start and ramp."""
    code = (
        "import sys, numpy; from fastpool._bench import peers; "
        "print(peers.burst_s(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))"
    )
    return _fresh_python(code, name, str(workers), str(tasks), str(seconds))


def import_after_numpy_s() -> float:
    """Seconds of ``import fastpool`` in a new interpreter that has imported numpy."""
    code = (
        "import time, numpy; t0 = time.perf_counter(); import fastpool; "
        "print(time.perf_counter() - t0)"
    )
    return _fresh_python(code)


def spawn_reference_s() -> float:
    """A plain ``multiprocessing`` spawn of one child that imports numpy, from a new
    interpreter that has imported numpy: what any fresh-interpreter start costs here,
    the yardstick for a first pool."""
    code = (
        "import multiprocessing as mp, time, numpy; from fastpool._bench import tasks\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn'); t0 = time.perf_counter()\n"
        "    p = ctx.Process(target=tasks.import_numpy); p.start(); p.join()\n"
        "    assert p.exitcode == 0, p.exitcode\n"
        "    print(time.perf_counter() - t0)"
    )
    return _fresh_python(code)
