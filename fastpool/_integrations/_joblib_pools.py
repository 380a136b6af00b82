"""The joblib backend's pools: one per configuration, reused across Parallel calls.

    Parallel call -> FastpoolBackend.configure -> lease(workers, options)
                       same workers and options as an earlier call: the same Pool
    Parallel ends -> FastpoolBackend.terminate  -> release(lease)
                       the last lease gone: the pool is idle from now on
    reaper thread    shuts down a pool idle for ``idle_worker_timeout`` seconds
                     (default 300, loky's figure; None: never), and sooner, after
                     EXCESS_IDLE_S, the idle pools beyond the budget: no more idle
                     workers in all than the largest pool made
    interpreter exit shuts down every pool, cancelling the batches not yet started
                     (an abandoned return_as="generator" call's): its hook runs
                     before fastpool's own, which would run them

Like loky's reusable executor, workers outlive one Parallel call: starting them,
and importing scikit-learn in them, is the expensive part of a short call.
Unlike it, a pool never restarts because another call asked for other options:
each configuration has its own pool.  A sweep over n_jobs (1, 2, 3, 8, 16, 32, as
scikit-learn's test_parallel_train fits) would then hold one idle pool per value for
idle_worker_timeout -- 61 workers, 5.2 GiB -- where loky's one executor holds the
largest; the budget keeps the most recently used idle pools that fit in the largest
pool's size and closes the rest within about a second.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import logging
import os
import sys
import threading
import time
from concurrent.futures import CancelledError, Future
from typing import Any

from fastpool.pool import Pool

log = logging.getLogger("fastpool")

DEFAULT_IDLE_TIMEOUT_S: float | None = 300.0
# An idle pool beyond the budget lives this long: calls that alternate between two
# n_jobs back to back still find both pools, and a sweep's memory comes back at once.
EXCESS_IDLE_S = 1.0
# idle_worker_timeout not given: a new pool gets the default, an old one keeps its own
UNSET: Any = object()

# What fastpool.Pool takes, with its defaults: an option equal to its default is
# dropped from the key, so `task_timeout=None` and no task_timeout share one pool.
_POOL_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(Pool.__init__).parameters.items()
    if p.kind is p.KEYWORD_ONLY
}
POOL_OPTIONS = frozenset(_POOL_DEFAULTS) - {"max_workers"}


def check_options(options: dict[str, Any]) -> None:
    """Raises TypeError naming an option fastpool.Pool does not take."""
    for name in options:
        if name in ("workers", "max_workers"):
            raise TypeError(
                f"the fastpool joblib backend sizes its pool from n_jobs; "
                f"pass n_jobs=... instead of {name}="
            )
        if name not in POOL_OPTIONS:
            raise TypeError(
                f"the fastpool joblib backend got an unknown option {name!r}: it takes "
                f"joblib's own arguments, idle_worker_timeout, and fastpool.Pool's "
                f"options ({', '.join(sorted(POOL_OPTIONS))})"
            )


def check_idle_timeout(value: Any) -> None:
    """Raises ValueError unless ``value`` is None (never retire) or positive seconds."""
    if value is UNSET or value is None:
        return
    seconds = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not seconds or not 0 < value < float("inf"):
        raise ValueError(
            f"idle_worker_timeout must be a positive number of seconds or None "
            f"(keep the pool until exit), not {value!r}"
        )


def _frozen(value: Any) -> Any:
    """A hashable stand-in for an option value, equal only where the values are the same
    to the code that receives them, so that equal but freshly built options
    (``initargs=([1, 2],)``, a dict, an array) share one pool and unequal ones never do.

    Every part carries its exact type (``1``, ``1.0`` and ``True`` are equal in Python,
    not to an initializer); a float by its bits (``0.0 == -0.0``); a list, tuple or dict
    by its items in order, a set by its items; a plain ``numpy.ndarray`` with no object
    fields, or a numpy scalar, by its dtype, shape and a digest of its bytes in C order.
    The dtype is the dtype object itself, whose equality compares a structured dtype's
    names, offsets and formats (its ``.str`` is ``'|V<n>'`` for every one of them).
    Anything else that is not hashable is kept by identity (the entry holds it, so its id
    stays its own): an ndarray subclass (a masked array's mask is not in its bytes), an
    object that only looks like an array (``__array_interface__`` without a dtype: a PIL
    image)."""
    kind = type(value)
    if kind in (list, tuple):
        return (kind, tuple(_frozen(v) for v in value))
    if kind is dict:
        return (kind, tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    if kind in (set, frozenset):
        return (kind, frozenset(_frozen(v) for v in value))
    if isinstance(value, float):
        return (kind, value.hex())
    if isinstance(value, complex):
        return (kind, value.real.hex(), value.imag.hex())
    np = sys.modules.get("numpy")  # numpy's types exist only once numpy is imported
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        exact = kind is np.ndarray or isinstance(value, np.generic)
        if exact and not value.dtype.hasobject:
            digest = hashlib.blake2b(value.tobytes(), digest_size=16).digest()
            return (kind, value.dtype, value.shape, digest)
        return ("<by id>", id(value))
    try:
        hash(value)
    except TypeError:
        return ("<by id>", id(value))
    return (kind, value)


class Driver:
    """A thread that waits on a pool's unsettled joblib batches, one at a time.

    joblib's main thread polls with time.sleep(0.01) and never waits on a future, so
    without a waiter every batch would be settled by the pool's collector thread,
    which keeps away for a moment after each submit (and joblib submits the next batch
    from each settlement).  A thread waiting on a future drives completions itself:
    joblib's callbacks, and the next batch's submit, run here at once.  One per pool,
    started with its first batch and kept (a thread start costs a call up to ms)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: set[Future[Any]] = set()
        self.wake = threading.Event()
        self.closed = False
        self.thread: threading.Thread | None = None

    def watch(self, fut: Future[Any]) -> None:
        with self.lock:
            self.pending.add(fut)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="fastpool-joblib-driver", daemon=True
                )
                self.thread.start()
        self.wake.set()
        fut.add_done_callback(self._settled)

    def _settled(self, fut: Future[Any]) -> None:
        with self.lock:
            self.pending.discard(fut)

    def _run(self) -> None:
        while True:
            with self.lock:
                if self.closed:
                    return
                fut = next(iter(self.pending), None)
                if fut is None:
                    self.wake.clear()
            if fut is None:
                self.wake.wait()
                continue
            try:
                fut.exception()  # returns once fut settles, settling others on the way
            except CancelledError:
                pass

    def close(self) -> None:
        """Lets the thread end, once the batch it waits on (if any) has settled."""
        with self.lock:
            self.closed = True
        self.wake.set()


class _Entry:
    """One configuration's pool and who uses it.  Guarded by ``_cond``."""

    def __init__(self, key: tuple, pool: Pool, options: dict[str, Any]) -> None:
        self.key, self.pool, self.options = key, pool, options
        self.workers: int = key[0]
        self.driver = Driver()
        self.leases = 0
        self.idle_since = time.monotonic()
        self.idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S


_cond = threading.Condition()
_entries: dict[tuple, _Entry] = {}
_reaper: list[threading.Thread] = []
_exit_hook: list[Any] = []  # shutdown_all, once registered with atexit
# The idle workers' budget: the most workers one pool has had since the last shutdown_all.
_most_workers = [0]


def _is_default(name: str, value: Any) -> bool:
    default = _POOL_DEFAULTS[name]
    return value is default or (type(value) is type(default) and value == default)


def _key(workers: int, options: dict[str, Any]) -> tuple:
    kept = {k: v for k, v in options.items() if not _is_default(k, v)}
    return (workers, tuple(sorted((k, _frozen(v)) for k, v in kept.items())))


def _open(workers: int, options: dict[str, Any], idle_timeout_s: float | None) -> _Entry:
    key = _key(workers, options)
    with _cond:
        entry = _entries.get(key)
        if entry is not None and entry.pool._closed():  # shut down by its user: replace it
            del _entries[key]
            entry.driver.close()
            entry = None
        if entry is None:
            # Made under the lock: two threads asking for one configuration get one pool.
            entry = _Entry(key, Pool(workers, **options), dict(options))
            _entries[key] = entry
            _most_workers[0] = max(_most_workers[0], workers)
            if not _exit_hook:
                # Registered after the first Pool registered fastpool's own exit hook
                # (fastpool.pool loads that lazily, with its first pool): atexit runs
                # hooks last-in first-out, so this one runs first and cancels the
                # batches no one will read before that hook would run them.
                atexit.register(shutdown_all)
                _exit_hook.append(shutdown_all)
        if idle_timeout_s is not UNSET:
            entry.idle_timeout_s = idle_timeout_s
        if not _reaper:
            t = threading.Thread(target=_reap, name="fastpool-joblib-reaper", daemon=True)
            t.start()
            _reaper.append(t)
        _cond.notify()
        return entry


def lease(workers: int, options: dict[str, Any], idle_timeout_s: float | None) -> _Entry:
    """The pool for this configuration, made on first use; counted in use until
    ``release``.  Raises what ``fastpool.Pool`` raises for bad options.  Thread-safe."""
    entry = _open(workers, options, idle_timeout_s)
    with _cond:
        entry.leases += 1
    return entry


def release(entry: _Entry) -> None:
    """Ends one lease; the last one starts the pool's idle time.  Thread-safe."""
    with _cond:
        entry.leases -= 1
        if entry.leases == 0:
            entry.idle_since = time.monotonic()
            _cond.notify()


def pool_for(workers: int, options: dict[str, Any], idle_timeout_s: float | None) -> Pool:
    """The pool this configuration's Parallel calls use (made now if needed), unleased."""
    entry = _open(workers, options, idle_timeout_s)
    with _cond:
        if entry.leases == 0:
            entry.idle_since = time.monotonic()  # asking for it counts as use
    return entry.pool


def _expired(now: float) -> tuple[list[_Entry], float | None]:
    """The idle pools due to shut down now (taken out of ``_entries``), and when the next
    one is due.  The most recently used idle pools that fit in the budget, and those kept
    until exit (``idle_worker_timeout=None``), live for their idle timeout; the others
    for EXCESS_IDLE_S at most."""
    idle = [e for e in _entries.values() if not e.leases]
    idle.sort(key=lambda e: (e.idle_timeout_s is not None, -e.idle_since))
    out, wake, kept = [], None, 0
    for entry in idle:
        timeout = entry.idle_timeout_s
        if timeout is None:
            kept += entry.workers
            continue
        if kept + entry.workers <= _most_workers[0]:
            kept += entry.workers
        else:
            timeout = min(timeout, EXCESS_IDLE_S)
        due = entry.idle_since + timeout
        if due <= now:
            del _entries[entry.key]
            out.append(entry)
        else:
            wake = due if wake is None else min(wake, due)
    return out, wake


def _reap() -> None:
    while True:
        with _cond:
            retired, wake = _expired(time.monotonic())
            if not retired:
                _cond.wait(None if wake is None else max(0.0, wake - time.monotonic()))
                continue
        for entry in retired:
            idle_s = time.monotonic() - entry.idle_since
            log.debug("fastpool: joblib pool %s retired after %.1f s idle", entry.key, idle_s)
            entry.pool.shutdown(wait=True, cancel_futures=True)
            entry.driver.close()


def shutdown_all(wait: bool = True) -> None:
    """Shuts down every pool the backend holds; later Parallel calls make new ones."""
    with _cond:
        entries = list(_entries.values())
        _entries.clear()
        _most_workers[0] = 0
    for entry in entries:
        entry.pool.shutdown(wait=wait, cancel_futures=True)
        entry.driver.close()


def live_pools() -> list[Pool]:
    with _cond:
        return [e.pool for e in _entries.values()]


def _forget_after_fork() -> None:
    # A forked child -- the user's, or a worker whose template was forked while a
    # Parallel call made its first pool under _cond -- inherits the parent's pools
    # disowned (see fastpool.pool), no reaper thread, and _cond perhaps held.  A nested
    # Parallel there must start from nothing: its own pool, reaped like any other.
    global _cond
    _cond = threading.Condition()
    _entries.clear()
    _reaper.clear()
    _most_workers[0] = 0


os.register_at_fork(after_in_child=_forget_after_fork)
