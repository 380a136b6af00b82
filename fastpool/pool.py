"""The public Pool: a concurrent.futures.Executor over a shared-memory board.

Data flow:

    submit() -------- pickle outside the lock --------+
      |  pool lock: FIFO queue -> LIFO idle slot       |
      v                                                v
    board task ring (slot i) ====> worker i: pop, run, push ====> board result ring (slot i)
                                                                        |
    result() / map() on the caller's thread  <--- drive: poll rings, ----+
    (or the collector thread, when nobody     return capacity, dispatch
     waits)                                   queued work, THEN settle futures

    supervisor thread: pidfds of workers, the template connection, timers
      death  -> record it, flag the board; the driver fails exactly the task the
                slot held (slot.current) and requeues tasks it never started
      timers -> restarts (backoff + jitter, breaker), task timeouts, heartbeats

Two threads never consume the result rings at once: whoever holds the drive
lock does.  A thread blocked in result() takes the lock from the collector
thread (which yields it at once), so a result reaches its waiter without a
thread hand-off; the collector serves callbacks and futures nobody waits on.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import math
import os
import selectors
import signal
import socket
import threading
import time
import weakref
from collections import deque
from concurrent.futures import CancelledError, Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from fastpool import _arena, _codec, _memory, _policy, _sizing, _template, _worker, errors
from fastpool._codec import (
    K_CALL,
    K_INIT,
    K_STOP,
    R_BAD_RESULT,
    R_ERR,
    R_INIT_FAILED,
    R_OK,
    R_READY,
)
from fastpool._core import Board

log = logging.getLogger("fastpool")

DEFAULT_RING_BYTES = 64 << 20  # per direction per worker; sparse, only touched pages cost
PARENT_SPIN_S = float(os.environ.get("FASTPOOL_PARENT_SPIN_US", "80")) * 1e-6
PARK_SLICE_S = 0.05  # every wait returns this often, so Ctrl-C and deadlines are seen
COLLECTOR_GRACE_S = 0.002  # the collector stays away this long after a caller drove
VERDICTS = ("timeout", "cancelled", "memory", "hung")  # fastpool's own kills, for a task's sake
MAX_PREFETCH = 16
STOP_GRACE_S = 2.0
EXIT_STATUS_WAIT_S = 1.0

_ids = itertools.count(1)
_live_pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()


def _shutdown_all_at_exit() -> None:
    for pool in list(_live_pools):
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        except Exception:  # noqa: BLE001 - interpreter teardown: best effort
            pass


atexit.register(_shutdown_all_at_exit)


class _PoolFuture(Future):
    """A Future whose result() drives the pool itself instead of sleeping on a condition."""

    _pool: "Pool | None" = None

    def result(self, timeout: float | None = None) -> Any:
        if not self.done() and self._pool is not None:
            self._pool._drive(self.done, timeout)
            if not self.done():
                raise FuturesTimeout()
        return super().result(timeout=0 if self.done() else timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.done() and self._pool is not None:
            self._pool._drive(self.done, timeout)
            if not self.done():
                raise FuturesTimeout()
        return super().exception(timeout=0 if self.done() else timeout)


class _ResultIterator(itertools.chain):
    """The iterator map() returns: items of each chunk's result list, iterated in C
    (no generator step per item), plus ``close()`` like a generator's, which
    cancels the chunks not yet run."""

    _chunks: Iterator[list]

    @classmethod
    def over(cls, chunks: Iterator[list]) -> "_ResultIterator":
        it = cls.from_iterable(chunks)
        it._chunks = chunks
        return it

    def close(self) -> None:
        self._chunks.close()  # type: ignore[attr-defined]


class _Task:
    __slots__ = ("id", "future", "payload", "fn_name", "options", "attempts", "slot",
                 "t_submit", "t_dispatch", "cancel_requested")

    def __init__(self, tid: int, future: _PoolFuture, payload: bytes, fn_name: str,
                 options: _policy.TaskOptions | None) -> None:
        self.id = tid
        self.future = future
        self.payload = payload
        self.fn_name = fn_name
        self.options = options
        self.attempts = 0
        self.slot = -1
        self.t_submit = time.monotonic()
        self.t_dispatch = 0.0
        self.cancel_requested = False


class _Slot:
    __slots__ = ("id", "state", "pid", "pidfd", "assigned", "breaker", "spawned_at",
                 "answered", "served", "kill_reason", "req", "cur_seen", "cur_since", "hb_seen",
                 "hb_since", "init_error", "mem", "cg", "oom_before",
                 "retiring", "baseline", "cg_text", "via")

    def __init__(self, sid: int, breaker: _policy.SlotBreaker) -> None:
        self.id = sid
        self.state = "empty"  # empty, starting, ready, dead, backing_off, open, stopping
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.assigned: deque[int] = deque()
        self.breaker = breaker
        self.spawned_at = 0.0
        self.answered = False
        self.served = 0
        self.kill_reason: tuple[str, int | None, str] | None = None
        self.req = 0
        self.cur_seen = 0
        self.cur_since = 0.0
        self.hb_seen = -1
        self.hb_since = 0.0
        self.init_error: BaseException | None = None
        self.mem: _memory.WorkerMemory | None = None
        self.cg: dict | None = None  # the worker's own memory cgroup, tracked while it lives
        self.cg_text: str | None = None
        self.via: Any = None  # the template connection that forked this slot's worker
        self.oom_before: int | None = None
        self.retiring = False
        self.baseline: int | None = None


def _summarise(payload: bytes) -> str:
    """Argument shapes for crash records: types, array shapes and sizes, never data.

    Computed from the task's pickle only when a crash needs it, so submit pays nothing."""
    try:
        _fn, args, kwargs = _codec.loads(payload)
    except Exception:  # noqa: BLE001
        return "?"

    def one(a: Any) -> str:
        shape = getattr(a, "shape", None)
        if shape is not None and hasattr(a, "dtype"):
            return f"ndarray{tuple(shape)} {a.dtype} {getattr(a, 'nbytes', 0)} B"
        if isinstance(a, (list, tuple, dict, set)):
            return f"{type(a).__name__}[{len(a)}]"
        return type(a).__name__
    parts = [one(a) for a in args[:8]] + [f"{k}={one(v)}" for k, v in list(kwargs.items())[:8]]
    return ", ".join(parts)


class Pool(Executor):
    """A process pool for NumPy batch work: fast hops, supervised workers.

    ``Pool(workers=None, *, initializer=None, initargs=(), max_queue=None,
    on_full="block", task_timeout=None, hang_timeout=None, ...)``

    - ``workers``: number of worker processes; default: the CPUs this process may
      use (affinity and cgroup quota), see README "Sizing".
    - ``initializer(*initargs)`` runs in every worker, replacements included,
      before it takes work.  One that raises or exits counts as a failure of its
      slot: the slot backs off and, after ``max_failures`` in a row, its breaker opens.
    - ``max_queue``: tasks accepted but not yet handed to a worker (default
      ``256 * workers``).  When full, ``submit`` blocks (``on_full="block"``,
      optionally with ``queue_timeout``) or raises ``QueueFull`` (``on_full="reject"``).
    - ``task_timeout``: default per-task run time limit in seconds; a task over it
      fails with ``TaskTimeout`` and its worker is killed and replaced.
    - ``hang_timeout``: seconds without a heartbeat after which a busy worker is
      declared hung (``WorkerHung``) and replaced; default 60 s, because a C routine that
      holds the GIL (and so stops the heartbeat) can legitimately run for many seconds.

    Thread safety: ``submit``, ``map``, ``imap_unordered``, ``stats`` and
    ``shutdown`` may be called from any number of threads at once.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple = (),
        max_queue: int | None = None,
        on_full: str = "block",
        queue_timeout: float | None = None,
        task_timeout: float | None = None,
        hang_timeout: float | None = 60.0,
        ring_bytes: int = DEFAULT_RING_BYTES,
        backoff_base_s: float = 0.25,
        backoff_cap_s: float = 30.0,
        max_failures: int = 6,
        breaker_open_s: float = 300.0,
        blas_threads: int | None = None,
        memory_limit: int | float | str | None = None,
        memory_interval_s: float = 0.1,
        max_tasks_per_worker: int | None = None,
        leak_threshold: int | str | None = None,
        min_available_memory: int | float | str | None = 0.03,
        arena_bytes: int | None = None,
    ) -> None:
        if _template.BOOTING:
            raise RuntimeError(
                "a fastpool.Pool was created while the worker template imported your main "
                "script; guard the code that creates pools with `if __name__ == \"__main__\":`"
            )
        limit = _sizing.parse_memory(memory_limit) if memory_limit is not None else None
        if workers is None or workers == "auto":
            # with a per-worker budget, never start more workers than memory allows
            workers = _sizing.default_workers(limit)
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive int, not {workers!r}")
        if on_full not in ("block", "reject"):
            raise ValueError(f"on_full must be 'block' or 'reject', not {on_full!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be callable")
        if ring_bytes < 1 << 16 or ring_bytes % 4096 or ring_bytes > 1 << 33:
            raise ValueError("ring_bytes must be a multiple of 4096 between 64 KiB and 8 GiB")
        self._n = workers
        self._max_queue = max_queue if max_queue is not None else 256 * workers
        if self._max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self._on_full = on_full
        self._queue_timeout = queue_timeout
        self._task_timeout = task_timeout
        self._hang_timeout = hang_timeout
        self._memory_limit = limit
        self._memory_interval_s = memory_interval_s
        if max_tasks_per_worker is not None and max_tasks_per_worker < 1:
            raise ValueError("max_tasks_per_worker must be >= 1")
        self._max_tasks = max_tasks_per_worker
        self._leak_threshold = _sizing.parse_memory(leak_threshold) if leak_threshold is not None else None
        self._min_available = (_sizing.parse_memory(min_available_memory)
                               if min_available_memory is not None else None)
        self._available_memory = _sizing.available_memory_bytes  # replaced in tests
        self._paused = False
        self._last_available: int | None = None
        self._next_memory_tick = 0.0

        init_fn = _codec.function_bytes(initializer) if initializer is not None else None
        if blas_threads is None:
            blas_threads = max(1, _sizing.usable_cpus() // workers)
        init_call = (init_fn, tuple(initargs), blas_threads)  # encoded once the arena exists

        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # the queue has room again
        self._progress = threading.Condition(threading.Lock())  # a driver settled something
        self._drive_lock = threading.Lock()
        self._handoff = threading.Event()
        self._queue: deque[_Task] = deque()
        self._idle: list[int] = []  # LIFO: the warmest worker takes the next task
        self._inflight: dict[int, _Task] = {}
        self._deaths: deque[tuple[int, int, int | None]] = deque()
        self._inline_later: deque[_Task] = deque()
        self._closed = False
        self._stopping = False
        self._torn_down = threading.Event()
        self._depth = 1
        self._ewma_run_ns = 1e6
        self._fg_waiting = 0
        self._driver: int | None = None  # the thread that holds the drive lock now
        self._last_fg = 0.0

        self._counts = dict(submitted=0, completed=0, failed=0, crashed=0, restarts=0,
                            cancelled=0, unknown_replies=0, retried=0, bad_results=0, inline=0,
                            recycled=0, paused=0)
        self._crashes: deque[dict] = deque(maxlen=256)
        self._wait_ns: deque[int] = deque(maxlen=8192)
        self._run_ns: deque[int] = deque(maxlen=8192)

        now = time.monotonic()
        self._slots = [
            _Slot(i, _policy.SlotBreaker(max_failures, breaker_open_s,
                                         _policy.Backoff(backoff_base_s, backoff_cap_s)))
            for i in range(workers)
        ]
        self._board = Board.create(workers, ring_bytes)
        self._arena_keep: list = []  # blocks of shared arrays in initargs: live as long as the pool
        self._send_lock = threading.Lock()
        self._timers: list[tuple[float, int, str, int]] = []  # (when, seq, what, slot)
        self._timer_seq = itertools.count()
        self._pending_exit: dict[int, int] = {}
        self._sup_lock = threading.Lock()  # timers and spawn requests
        opened: list[Any] = [self._board]
        try:
            self._arena = _arena.Arena.create(workers, arena_bytes or _arena.default_budget())
            opened.append(self._arena)
            self._init_payload = _codec.encode_init(init_call, self._arena, self._arena_keep)
            if len(self._init_payload) > self._board.max_record:
                raise errors.SerializationError(
                    "initializer and initargs",
                    f"their pickle is {len(self._init_payload)} bytes, over the ring limit of "
                    f"{self._board.max_record} bytes; pass large data as arrays (they travel by "
                    "descriptor through shared memory) or raise Pool(ring_bytes=...)")
            self._conn = _template.template().connect()
            opened.append(self._conn)
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            opened += [_FdCloser(self._wake_r), _FdCloser(self._wake_w)]
            self._sel = selectors.DefaultSelector()
            opened.append(self._sel)
            self._sel.register(self._conn, selectors.EVENT_READ, ("conn", -1))
            self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", -1))
            for slot in self._slots:
                self._spawn(slot, now)
        except BaseException:
            for thing in reversed(opened):  # the connection's close also ends any worker started
                thing.close()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="fastpool-supervisor", daemon=True)
        self._collector = threading.Thread(target=self._collect_loop, name="fastpool-collector", daemon=True)
        self._supervisor.start()
        self._collector.start()
        _live_pools.add(self)

    # ---- public API ------------------------------------------------------------------

    @property
    def workers(self) -> int:
        """The number of worker slots (fixed for the pool's life).  Thread-safe."""
        return self._n

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Schedules ``fn(*args, **kwargs)`` in a worker and returns its Future.

        Raises ``PoolClosed`` after ``shutdown``, ``SerializationError`` if an argument
        cannot be pickled (nothing is submitted), ``QueueFull`` when the queue is full
        and ``on_full="reject"`` (or ``queue_timeout`` passed), ``CircuitOpen`` when
        every worker slot's breaker is open.  A task that raises sets that exception
        on the future, with the worker's traceback as ``__cause__``.  Thread-safe."""
        return self._submit(fn, args, kwargs, getattr(fn, "options", None) if isinstance(fn, TaskFunction) else None)

    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> Any:
        """An uninitialised ndarray in this pool's shared memory (README "Zero-copy arrays").

        Passing it, or any view of it, to a task moves a descriptor, not bytes; the
        worker sees the same memory.  Raises SharedMemoryError (saying what is free)
        when it cannot fit, TypeError for object dtypes, PoolClosed after shutdown.
        Thread-safe."""
        self._arrays_open()
        return _arena.new_array(self._arena, shape, dtype, order)

    def zeros(self, shape: Any, dtype: Any = float, order: str = "C") -> Any:
        """Like ``empty``, filled with zeros; fails like ``empty``.  Thread-safe."""
        self._arrays_open()
        return _arena.new_array(self._arena, shape, dtype, order, True)

    def share(self, arr: Any, readonly: bool = False) -> Any:
        """A copy of ``arr`` in this pool's shared memory (the one copy in).

        ``readonly=True``: the copy, and every view of it a worker receives, is not
        writeable.  Errors as for ``empty``.  Thread-safe."""
        self._arrays_open()
        return _arena.share(self._arena, arr, readonly)

    def _arrays_open(self) -> None:
        if self._closed:
            raise errors.PoolClosed("this pool was shut down: its shared memory takes no new arrays")

    def options(self, *, pure: bool = False, timeout: float | None = None,
                fallback: str | None = None) -> "PoolOptions":
        """A view of this pool whose ``submit``/``map`` apply these supervision options.

        ``pure=True``: a task whose worker crashed is re-run once on a fresh worker;
        if it kills a second one it fails with ``PoisonTask``.  ``timeout``: run time
        limit (``TaskTimeout``).  ``fallback="inline"``: run in the calling process
        when the pool cannot serve (every breaker open).  Options travel beside the
        call, so they never collide with the function's own keyword arguments.
        Raises ValueError for bad options.  Thread-safe; the view may be shared."""
        return PoolOptions(self, _policy.TaskOptions(pure=pure, timeout=timeout, fallback=fallback))

    def cancel(self, future: Future, *, force: bool = False) -> bool:
        """Cancels a task: queued ones at once; running ones cooperatively or by force.

        Queued: like ``future.cancel()``.  Running, ``force=False``: sets a flag the
        task can poll with ``fastpool.cancelled()``; when it returns, the future
        raises ``CancelledError``.  Running, ``force=True``: the worker is killed and
        replaced, and the future raises ``CancelledError``.  Returns False if the
        future already finished.  Thread-safe."""
        if future.cancel():
            return True
        with self._lock:
            task = next((t for t in self._inflight.values() if t.future is future), None)
            if task is None or future.done():
                return False
            task.cancel_requested = True
            slot = self._slots[task.slot] if task.slot >= 0 else None
            if slot is None or task.id not in slot.assigned:
                return True
            if not force:
                self._board.request_cancel(slot.id, task.id)
                return True
            if self._board.current(slot.id) == task.id:
                self._kill(slot, ("cancelled", task.id, "cancelled by force"))
                return True
            # prefetched but not started: it will be dropped when its slot reaches it
            return True

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict,
                options: _policy.TaskOptions | None) -> _PoolFuture:
        if self._closed:
            raise errors.PoolClosed()
        fn_bytes = _codec.function_bytes(fn)
        keep: list = []  # shared blocks the call names: held until its future settles
        payload = _codec.encode_call(fn_bytes, args, kwargs, self._arena, keep)
        if len(payload) > self._board.max_record:
            raise errors.SerializationError(
                f"the call of {getattr(fn, '__qualname__', fn)!r}",
                f"its pickle is {len(payload)} bytes, over the ring limit of {self._board.max_record} "
                "bytes; pass large arrays through shared memory (pool.share) or raise "
                "Pool(ring_bytes=...). Nothing was submitted")
        fut = _PoolFuture()
        fut._pool = self
        if keep:
            _codec.hold(fut, keep)
        task = _Task(0, fut, payload, getattr(fn, "__qualname__", None) or repr(fn), options)
        try:
            self._enqueue(task)
        except errors.CircuitOpen:
            if options is None or options.fallback != "inline":
                raise
            self._run_inline(task, fn, args, kwargs)
        return fut

    def _run_inline(self, task: "_Task", fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        """Degraded mode: the pool cannot serve, so the caller's process runs the task."""
        fut = task.future
        if task.t_dispatch == 0.0 and not fut.set_running_or_notify_cancel():
            return
        self._count("inline")
        try:
            fut.set_result(_worker._run(fn, args, kwargs))
        except BaseException as exc:  # noqa: BLE001 - reported on the future like any task error
            fut.set_exception(exc)

    def _enqueue(self, task: _Task) -> None:
        deadline = None
        with self._lock:
            while True:
                if self._closed:
                    raise errors.PoolClosed()
                self._check_circuit_locked()
                if len(self._queue) < self._max_queue or self._driver == threading.get_ident():
                    break  # a callback on the driving thread never blocks: it would wait on itself
                if self._on_full == "reject":
                    raise errors.QueueFull(self._max_queue)
                if deadline is None and self._queue_timeout is not None:
                    deadline = time.monotonic() + self._queue_timeout
                if deadline is not None and time.monotonic() >= deadline:
                    raise errors.QueueFull(self._max_queue, self._queue_timeout)
                self._lock.release()
                try:  # drive completions ourselves: that is what makes room
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    # drain to a low-water mark, not one slot: one drive per many submits
                    low = self._max_queue - max(1, self._max_queue // 4)
                    self._drive(lambda: len(self._queue) <= low or self._closed,
                                PARK_SLICE_S if left is None else min(left, PARK_SLICE_S))
                finally:
                    self._lock.acquire()
            task.id = next(_ids)
            self._inflight[task.id] = task
            self._counts["submitted"] += 1
            self._queue.append(task)
            self._dispatch_locked()

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int | None = None) -> Iterator[Any]:
        """Like ``Executor.map``, but lazy: at most a window of chunks is in flight.

        Results come in input order; the first exception raised by ``fn`` is raised
        when its position is reached (results before it are yielded first).
        ``chunksize=None`` picks one from the input length (or adapts to the measured
        run time when the length is unknown).  ``timeout`` counts from this call;
        on ``TimeoutError`` or when the iterator is closed early, chunks not yet
        run are cancelled.  Thread-safe."""
        if self._closed:
            raise errors.PoolClosed()
        if not iterables:
            raise TypeError("map() needs at least one iterable")
        if chunksize is not None and chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        deadline = None if timeout is None else time.monotonic() + timeout
        star = len(iterables) > 1
        it: Iterator[Any] = zip(*iterables) if star else iter(iterables[0])
        fn_bytes = _codec.function_bytes(fn)
        adaptive = False
        if chunksize is None:
            try:
                n = min(len(x) for x in iterables)  # type: ignore[arg-type]
                chunksize = max(1, min(8192, math.ceil(n / (self._n * 8))))
            except TypeError:
                chunksize, adaptive = 4, True
        window = 2 * self._n + 2
        pending: deque[_PoolFuture] = deque()
        state = {"cs": chunksize}

        def submit_next() -> bool:
            chunk = list(islice(it, state["cs"]))
            if not chunk:
                return False
            pending.append(self._submit(_worker.run_chunk, (fn_bytes, chunk, star), {}, None))
            return True

        for _ in range(window):
            if not submit_next():
                break
        return _ResultIterator.over(self._map_results(pending, submit_next, deadline,
                                                      state if adaptive else None))

    def _map_results(self, pending: deque, submit_next: Callable[[], bool], deadline: float | None,
                     adaptive: dict | None) -> Iterator[Any]:
        try:
            while pending:
                fut = pending.popleft()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise FuturesTimeout()
                res = fut.result(left)
                if adaptive is not None and isinstance(res, list) and res:
                    run_ns = getattr(fut, "_run_ns", 0)
                    per_item = max(run_ns / len(res), 1)
                    adaptive["cs"] = int(min(8192, max(1, 2e6 / per_item)))
                submit_next()
                if isinstance(res, _worker.ChunkFailure):
                    yield res.results
                    raise _codec.decode_exception(res.exc_payload)
                yield res
        finally:
            for fut in pending:
                fut.cancel()

    def imap_unordered(self, fn: Callable[..., Any], iterable: Iterable[Any],
                       chunksize: int | None = None) -> Iterator[Any]:
        """Like ``map`` for one iterable, yielding results as they complete.

        An exception from ``fn`` is raised when its chunk completes.  Thread-safe."""
        if self._closed:
            raise errors.PoolClosed()
        it = iter(iterable)
        fn_bytes = _codec.function_bytes(fn)
        if chunksize is None:
            try:
                chunksize = max(1, min(8192, math.ceil(len(iterable) / (self._n * 8))))  # type: ignore[arg-type]
            except TypeError:
                chunksize = 16
        done: deque[_PoolFuture] = deque()
        pending: set[_PoolFuture] = set()
        window = 2 * self._n + 2

        def submit_next() -> bool:
            chunk = list(islice(it, chunksize))
            if not chunk:
                return False
            fut = self._submit(_worker.run_chunk, (fn_bytes, chunk, False), {}, None)
            pending.add(fut)
            fut.add_done_callback(done.append)
            return True

        for _ in range(window):
            if not submit_next():
                break
        return _ResultIterator.over(self._unordered_results(pending, done, submit_next))

    def _unordered_results(self, pending: set, done: deque, submit_next: Callable[[], bool]) -> Iterator[Any]:
        try:
            while pending:
                self._drive(lambda: bool(done), None)
                fut = done.popleft()
                pending.discard(fut)
                submit_next()
                res = fut.result()
                if isinstance(res, _worker.ChunkFailure):
                    yield res.results
                    raise _codec.decode_exception(res.exc_payload)
                yield res
        finally:
            for fut in pending:
                fut.cancel()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops taking work, then tears the pool down once accepted work settles.

        ``cancel_futures=True`` cancels tasks not yet handed to a worker.  With
        ``wait=True`` this returns after every accepted task settled and every worker
        exited; with ``wait=False`` the teardown happens in the background.  Tasks
        still unsettled when the pool is torn down fail with ``BrokenPool``; a worker
        that ignores the stop request is SIGKILLed after 2 s.  Never raises for a pool
        already shut down.  Idempotent and thread-safe."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                self._cancel_queued_locked()
            self._space.notify_all()
        self._board.kick()
        if wait and self._driver == threading.get_ident():
            # Called from a done-callback on the thread that consumes results: waiting
            # here would wait on ourselves.  The collector finishes the teardown.
            wait = False
        if wait:
            self._drive(lambda: not self._inflight or self._stopping, None)
            self._teardown()
        else:
            self._handoff.set()

    def drain(self) -> None:
        """Settles every accepted task (none is cancelled or lost), then tears down.

        Equivalent to ``shutdown(wait=True, cancel_futures=False)``.  Thread-safe."""
        self.shutdown(wait=True, cancel_futures=False)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True)

    def pids(self) -> list[int]:
        """The pids of the live workers right now (for tests and monitoring).

        A snapshot: a worker may die or be replaced the moment after.  Thread-safe."""
        return [s.pid for s in self._slots if s.pid is not None and s.state in ("starting", "ready")]

    def stats(self) -> dict[str, Any]:
        """A snapshot: counts, per-worker state, queue depth and latency percentiles.

        Thread-safe; cheap enough to call once a second."""
        now = time.monotonic()
        with self._lock:
            workers = []
            for s in self._slots:
                st = s.state
                b = s.breaker.state(now)
                health = "healthy" if st in ("ready", "starting") else b
                live = st in ("ready", "starting") and not self._board.closed
                info = self._board.slot_info(s.id) if live else (0, 0, 0, 0, s.served)
                workers.append(dict(slot=s.id, pid=s.pid, state=st, health=health,
                                    failures=s.breaker.failures, current_task=info[2] or None,
                                    served=info[4], heartbeat=info[3],
                                    age_s=(now - s.spawned_at) if s.pid else None,
                                    rss_bytes=s.mem.current_bytes if s.mem and live else None,
                                    peak_rss_bytes=s.mem.peak_bytes if s.mem else None,
                                    retiring=s.retiring))
            out = dict(self._counts, queued=len(self._queue), inflight=len(self._inflight),
                       workers=workers, prefetch=self._depth, closed=self._closed,
                       dispatch_paused=self._paused, available_memory_bytes=self._last_available,
                       memory_limit_bytes=self._memory_limit)
            waits, runs = sorted(self._wait_ns), sorted(self._run_ns)
        out["crashes"] = list(self._crashes)
        out["latency"] = {"queue_wait_us": _percentiles(waits), "run_us": _percentiles(runs)}
        return out

    # ---- dispatch (pool lock held) -------------------------------------------------------

    def _check_circuit_locked(self) -> None:
        if self._slots[0].state == "open" and all(s.state == "open" for s in self._slots):
            is_open, retry, cause = _policy.all_open([s.breaker for s in self._slots], time.monotonic())
            if is_open:
                raise errors.CircuitOpen(retry, cause)

    def _pick_locked(self) -> _Slot | None:
        if self._paused:
            return None  # memory pressure: feeding workers now would feed the OOM killer
        while self._idle:
            s = self._slots[self._idle.pop()]
            if self._accepts(s):
                return s
        if self._depth <= 1:
            return None
        best = None
        for s in self._slots:
            if s.state == "ready" and len(s.assigned) < self._depth and self._accepts(s):
                if best is None or len(s.assigned) < len(best.assigned):
                    best = s
        return best

    def _accepts(self, s: _Slot) -> bool:
        """A retiring worker gets nothing more; one near max_tasks only what it may still run."""
        if s.retiring:
            return False
        return self._max_tasks is None or s.served + len(s.assigned) < self._max_tasks

    def _dispatch_locked(self) -> None:
        board, queue = self._board, self._queue
        while queue:
            slot = self._pick_locked()
            if slot is None:
                return
            task = queue.popleft()
            if task.t_dispatch == 0.0:
                if not task.future.set_running_or_notify_cancel():
                    self._inflight.pop(task.id, None)  # cancelled while queued
                    self._counts["cancelled"] += 1
                    if not slot.assigned:
                        self._idle.append(slot.id)
                    continue
                task.t_dispatch = time.monotonic()
            if not board.push_task(slot.id, K_CALL, task.id, task.payload):
                queue.appendleft(task)  # ring full: the slot is busy enough
                if not slot.assigned:
                    self._idle.append(slot.id)
                return
            task.slot = slot.id
            slot.assigned.append(task.id)
        if len(queue) < self._max_queue:
            self._space.notify_all()

    def _cancel_queued_locked(self) -> None:
        while self._queue:
            task = self._queue.popleft()
            self._inflight.pop(task.id, None)
            task.future.cancel()
            self._counts["cancelled"] += 1

    # ---- driving: consuming results ----------------------------------------------------

    def _drive(self, pred: Callable[[], bool], timeout: float | None) -> bool:
        """Consumes results on this thread until pred() or timeout.  Returns pred()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._driver == threading.get_ident():
            return self._drive_held(pred, deadline)  # re-entered from a callback
        board = self._board
        board.want(1)  # keeps the collector thread off the rings while we drive
        try:
            while not pred():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self._drive_lock.acquire(timeout=min(left, 0.001) if left is not None else 0.001):
                    self._driver = threading.get_ident()
                    try:
                        return self._drive_held(pred, deadline)
                    finally:
                        self._driver = None
                        self._drive_lock.release()
                # Another thread drives; it notifies _progress after each batch.
                with self._progress:
                    self._fg_waiting += 1
                    try:
                        if not pred():
                            self._progress.wait(PARK_SLICE_S if left is None else min(left, PARK_SLICE_S))
                    finally:
                        self._fg_waiting -= 1
            return True
        finally:
            self._last_fg = time.monotonic()
            board.want(-1)

    def _drive_held(self, pred: Callable[[], bool], deadline: float | None) -> bool:
        board = self._board
        spin = PARENT_SPIN_S
        while not pred():
            if self._collect():
                spin = PARENT_SPIN_S
                continue
            if self._torn_down.is_set():
                return pred()
            left = PARK_SLICE_S if deadline is None else min(PARK_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                return pred()
            board.wait_results(left, spin)
            spin = 0.0
        return True

    def _collect(self) -> int:
        """One round: results from every ring, then deaths.  Drive lock held."""
        board = self._board
        if board.closed:
            return 0
        n = 0
        recs = board.poll_results()
        if recs:
            self._process(recs)
            n += len(recs)
        if board.take_attention():
            n += 1 + self._handle_deaths()
        if n and self._fg_waiting:
            with self._progress:
                self._progress.notify_all()
        return n

    def _collect_loop(self) -> None:
        """The collector thread: settles what no caller thread is waiting for.

        It never holds the drive lock while it sleeps, and it stays off the
        futex while caller threads drive (and for COLLECTOR_GRACE_S after), so a
        caller's round trip wakes no second thread and workers skip the wake
        system call."""
        board = self._board
        while not self._torn_down.is_set():
            if self._closed and (not self._inflight or self._stopping) and not board.wanted():
                self._teardown()
                return
            if board.wanted() or time.monotonic() - self._last_fg < COLLECTOR_GRACE_S:
                self._handoff.wait(COLLECTOR_GRACE_S)
                self._handoff.clear()
                continue
            if not self._drive_lock.acquire(blocking=False):
                self._handoff.wait(COLLECTOR_GRACE_S)
                self._handoff.clear()
                continue
            self._driver = threading.get_ident()
            try:
                n = self._collect()
            except Exception:  # noqa: BLE001 - the collector must not die silently
                log.exception("fastpool collector failed")
                n = 0
            finally:
                self._driver = None
                self._drive_lock.release()
            if n == 0 and not board.wanted():
                board.wait_results(PARK_SLICE_S, 0.0)

    def _process(self, recs: list) -> None:
        settle = []
        with self._lock:
            slots, inflight, counts = self._slots, self._inflight, self._counts
            for sid, kind, tid, aux, payload in recs:
                slot = slots[sid]
                if kind == R_READY:
                    # READY can overtake the template's ("pid", ...) message
                    if slot.state == "starting" and slot.pid in (None, aux):
                        slot.pid = aux
                        slot.state = "ready"
                        if not slot.assigned:
                            self._idle.append(sid)
                    continue
                if kind == R_INIT_FAILED:
                    slot.init_error = _codec.decode_exception(payload)
                    continue
                if slot.assigned and slot.assigned[0] == tid:
                    slot.assigned.popleft()
                else:
                    try:
                        slot.assigned.remove(tid)
                    except ValueError:  # not this slot's task: no capacity to return
                        self._counts["unknown_replies"] += 1
                        inflight.pop(tid, None)
                        continue
                if not slot.answered:
                    slot.answered = True
                    slot.breaker.on_success()  # first reply, not spawn: see _policy
                slot.served += 1
                if self._max_tasks is not None and slot.served >= self._max_tasks:
                    slot.retiring = True
                if slot.retiring:
                    if not slot.assigned:
                        self._retire_locked(slot)
                elif not slot.assigned and slot.state == "ready":
                    self._idle.append(sid)
                task = inflight.pop(tid, None)
                if task is None:
                    self._counts["unknown_replies"] += 1
                    continue
                if task.cancel_requested:
                    counts["cancelled"] += 1
                elif kind == R_OK:
                    counts["completed"] += 1
                elif kind == R_BAD_RESULT:
                    counts["bad_results"] += 1
                    counts["failed"] += 1
                else:
                    counts["failed"] += 1
                self._ewma_run_ns += 0.2 * (aux - self._ewma_run_ns)
                self._run_ns.append(aux)
                self._wait_ns.append(int((task.t_dispatch - task.t_submit) * 1e9))
                settle.append((task, kind, aux, payload))
            depth = 1 if self._ewma_run_ns > 1e6 else int(min(MAX_PREFETCH, max(2, 2e6 / max(self._ewma_run_ns, 1.0))))
            self._depth = depth
            if self._queue:
                self._dispatch_locked()  # capacity returns BEFORE any future settles
        for task, kind, aux, payload in settle:
            self._settle(task, kind, aux, payload)

    def _settle(self, task: _Task, kind: int, aux: int, payload: bytes) -> None:
        fut = task.future
        fut._run_ns = aux  # type: ignore[attr-defined]
        try:
            if task.cancel_requested:
                fut.set_exception(CancelledError(f"task {task.id} was cancelled while it ran"))
            elif kind == R_OK:
                try:
                    value = _codec.loads(payload)
                except Exception as exc:  # noqa: BLE001 - the parent cannot rebuild the result
                    self._count("completed", -1)
                    self._count("failed")
                    fut.set_exception(errors.SerializationError(
                        f"the result of task {task.id}", f"unpickling failed in the parent: {exc!r}"))
                    return
                fut.set_result(value)
            elif kind == R_ERR:
                fut.set_exception(_codec.decode_exception(payload))
            elif kind == R_BAD_RESULT:
                log.warning("fastpool: task %s (%s) returned a result that cannot be pickled; "
                            "the worker is fine", task.id, task.fn_name)
                fut.set_exception(_codec.decode_bad_result(payload))
        except Exception:  # noqa: BLE001 - InvalidStateError: cancelled meanwhile
            pass

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    # ---- deaths --------------------------------------------------------------------

    def _handle_deaths(self) -> int:
        recs = self._board.poll_results()  # what the dead worker published before dying
        if recs:
            self._process(recs)
        failed: list[tuple[_Task, BaseException]] = []
        handled = 0
        while self._deaths:
            sid, pid, exitcode = self._deaths.popleft()
            handled += 1
            with self._lock:
                slot = self._slots[sid]
                if slot.pid != pid:
                    continue
                self._arena.reclaim(sid)  # the dead worker's references on shared blocks
                current = self._board.current(sid)
                reason = slot.kill_reason
                slot.kill_reason = None
                requeue = []
                victim = None
                for tid in slot.assigned:
                    task = self._inflight.get(tid)
                    if task is None:
                        continue
                    if tid == current:
                        victim = task
                    else:
                        requeue.append(task)
                slot.assigned.clear()
                if sid in self._idle:
                    self._idle.remove(sid)
                for task in reversed(requeue):  # never started: back to the queue front
                    self._queue.appendleft(task)
                retired = reason is not None and reason[0] == "retire"
                if self._stopping or (reason is not None and reason[0] == "stop") or (retired and victim is None):
                    slot.state = "dead"
                    slot.pid = None
                    slot.retiring = False
                    if retired and not self._stopping:
                        self._counts["recycled"] += 1
                        self._spawn(slot, time.monotonic())  # a planned exit: no backoff, no breaker
                        self._dispatch_locked()
                    continue
                cause = reason[0] if reason else ("init" if slot.init_error or slot.state == "starting" else "died")
                if reason is not None and reason[1] is not None and victim is not None and victim.id != reason[1]:
                    # The kill was aimed at a task that finished just before it landed; the
                    # task that had started meanwhile is collateral, not the culprit.
                    reason = (reason[0], reason[1], f"killed by fastpool to stop task {reason[1]} "
                              f"({reason[0]}), which finished just before; this task had just started")
                    cause = "collateral"
                evidence = ""
                if exitcode == -signal.SIGKILL and reason is None:
                    confirmed, evidence = self._oom_evidence(slot)
                    if confirmed:
                        cause = "oom-killer"
                record = self._crash_record(slot, pid, exitcode, cause, victim, reason)
                if evidence:
                    record["evidence"] = evidence
                self._crashes.append(record)
                self._counts["crashed"] += 1
                if victim is not None:
                    exc = self._victim_error(slot, pid, exitcode, victim, cause, reason)
                    # fastpool's own kills (timeout, hang, cancel, memory limit) are verdicts
                    # on the task, not accidents: never retried
                    outcome = self._retry_outcome(victim) if reason is None or cause == "collateral" else "fail"
                    if outcome == "retry":
                        victim.attempts += 1
                        self._counts["retried"] += 1
                        self._queue.appendleft(victim)
                    else:
                        del self._inflight[victim.id]
                        if outcome == "poison":
                            exc = errors.PoisonTask(sid, pid, exitcode, victim.id, str(exc))
                        failed.append((victim, exc))
                        record["task_outcome"] = outcome
                log.error("fastpool: worker crashed: %s", record)
                if (cause in VERDICTS and victim is not None) or cause == "collateral":
                    # The worker was healthy; fastpool stopped it for its task.  Counting this
                    # as a slot failure would open the breaker on six slow tasks in a row.
                    slot.pid = None
                    slot.state = "backing_off"
                    self._add_timer(time.monotonic(), "respawn", slot.id)
                else:
                    self._schedule_restart_locked(slot, cause, record)
                self._dispatch_locked()
                if all(s.state == "open" for s in self._slots):
                    self._fail_queue_circuit_locked(failed)
        while self._inline_later:
            task = self._inline_later.popleft()
            fn_bytes, args, kwargs = _codec.loads(task.payload)
            self._run_inline(task, _worker._load_fn(fn_bytes), args, kwargs)
        for task, exc in failed:
            self._count("failed")
            try:
                task.future.set_exception(exc)
            except Exception:  # noqa: BLE001 - cancelled meanwhile
                pass
        return handled

    def _retire_locked(self, slot: _Slot) -> None:
        """Asks an idle worker to exit between tasks; its death spawns the replacement."""
        if slot.kill_reason is not None or slot.pid is None:
            return
        if slot.id in self._idle:
            self._idle.remove(slot.id)
        slot.kill_reason = ("retire", None, "")
        if not self._board.push_task(slot.id, K_STOP, 0, b""):
            self._kill(slot, ("retire", None, ""))

    def _oom_evidence(self, slot: _Slot) -> tuple[bool, str]:
        """Was this SIGKILL (that fastpool did not send) the kernel's OOM killer?"""
        after = _memory.oom_kill_count(slot.cg) if slot.cg else None
        mem = slot.mem
        return _memory.judge_sigkill(slot.oom_before, after, mem.current_bytes if mem and mem.samples else None,
                                     _cgroup_limit(slot.cg) or self._memory_limit, False)

    def _retry_outcome(self, task: _Task) -> str:
        if task.options is None:
            return "fail"
        return _policy.crash_outcome(task.options, task.attempts + 1, _codec.has_transferred(task.future))

    def _victim_error(self, slot: _Slot, pid: int, exitcode: int | None, task: _Task, cause: str,
                      reason: tuple | None) -> BaseException:
        detail = reason[2] if reason else ""
        if cause == "collateral":
            return errors.WorkerCrashed(slot.id, pid, exitcode, task.id, detail)
        if cause == "timeout":
            return errors.TaskTimeout(task.id, float(detail or 0), slot.id)
        if cause == "cancelled":
            return CancelledError(f"task {task.id} was cancelled; its worker was killed and replaced")
        if cause == "hung":
            return errors.WorkerHung(slot.id, pid, exitcode, task.id, detail)
        if cause in ("memory", "oom-killer"):
            mem = slot.mem
            limit = self._memory_limit
            if cause == "oom-killer":
                limit = _cgroup_limit(slot.cg) or limit
            return errors.WorkerMemoryError(
                slot.id, pid, exitcode, task.id, detail or f"function {task.fn_name}({_summarise(task.payload)})",
                reason="memory-limit" if cause == "memory" else "oom-killer", limit_bytes=limit,
                rss_bytes=mem.current_bytes if mem and mem.samples else None,
                peak_rss_bytes=mem.peak_bytes if mem and mem.samples else None)
        return errors.WorkerCrashed(slot.id, pid, exitcode, task.id,
                                    f"function {task.fn_name}({_summarise(task.payload)})")

    def _crash_record(self, slot: _Slot, pid: int, exitcode: int | None, cause: str, task: _Task | None,
                      reason: tuple | None) -> dict:
        return dict(
            time=time.time(), slot=slot.id, pid=pid, cause=cause, exitcode=exitcode,
            signal=errors.signal_name(exitcode),
            task_id=task.id if task else None, function=task.fn_name if task else None,
            args=_summarise(task.payload) if task else None,
            worker_age_s=round(time.monotonic() - slot.spawned_at, 3), tasks_served=slot.served,
            detail=(reason[2] if reason else "") or (repr(slot.init_error) if slot.init_error else ""),
        )

    def _fail_queue_circuit_locked(self, failed: list) -> None:
        is_open, retry, cause = _policy.all_open([s.breaker for s in self._slots], time.monotonic())
        if not is_open:
            return
        while self._queue:
            task = self._queue.popleft()
            self._inflight.pop(task.id, None)
            if task.options is not None and task.options.fallback == "inline":
                self._inline_later.append(task)
                continue
            failed.append((task, errors.CircuitOpen(retry, cause)))

    # ---- supervisor thread ---------------------------------------------------------

    def _spawn(self, slot: _Slot, now: float) -> None:
        """Asks the template for a worker in this slot (pool lock NOT required)."""
        self._board.reset_slot(slot.id)
        self._board.push_task(slot.id, K_INIT, 0, self._init_payload)
        slot.state = "starting"
        slot.answered = False
        slot.init_error = None
        slot.served = 0
        slot.spawned_at = now
        slot.kill_reason = None
        slot.cur_seen, slot.hb_seen = 0, -1
        slot.mem, slot.cg, slot.oom_before, slot.baseline, slot.cg_text = None, None, None, None, None
        slot.retiring = False
        slot.req = next(_ids)  # unique across slots: the reply is matched by it
        msg, fds = ("spawn", slot.req, slot.id, {}), [self._board.fileno(), self._arena.fileno()]
        with self._send_lock:
            try:
                _template._send(self._conn, msg, fds)
            except OSError:  # the template died (its workers with it): start another
                self._reconnect_template()
                _template._send(self._conn, msg, fds)
            slot.via = self._conn

    def _reconnect_template(self) -> None:
        """The template's connection closed: its workers are dead too (they die with it),
        and their pidfds report it.  A new template serves the restarts."""
        try:
            self._sel.unregister(self._conn)
        except (KeyError, ValueError):
            pass
        self._conn.close()
        if self._stopping:
            return
        log.error("fastpool: the worker template exited; starting a new one")
        self._conn = _template.template().connect()
        self._sel.register(self._conn, selectors.EVENT_READ, ("conn", -1))

    def _schedule_restart_locked(self, slot: _Slot, cause: str, record: dict) -> None:
        slot.pid = None
        now = time.monotonic()
        action, at = slot.breaker.on_failure(now, f"{cause}: {record.get('detail') or record.get('signal') or record.get('exitcode')}")
        slot.state = "open" if action == "open" else "backing_off"
        self._add_timer(at, "restart", slot.id)

    def _add_timer(self, when: float, what: str, sid: int) -> None:
        with self._sup_lock:
            heapq.heappush(self._timers, (when, next(self._timer_seq), what, sid))
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _supervise(self) -> None:
        while not self._stopping:
            try:
                self._supervise_once()
            except Exception:  # noqa: BLE001 - the supervisor must outlive any one failure
                if self._stopping:
                    return
                log.exception("fastpool supervisor: an iteration failed; going on")
                time.sleep(0.01)

    def _supervise_once(self) -> None:
        timeout = self._next_timeout()
        for key, _ in self._sel.select(timeout):
            what, sid = key.data
            if what == "conn":
                self._read_template()
            elif what == "wake":
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            elif what == "pidfd":
                self._on_pidfd(sid, key.fileobj)  # type: ignore[arg-type]
        self._run_timers()
        self._check_liveness()
        if time.monotonic() >= self._next_memory_tick:
            self._next_memory_tick = time.monotonic() + self._memory_interval_s
            self._check_memory()

    def _next_timeout(self) -> float:
        t = 0.1 if (self._task_timeout or self._hang_timeout) else 0.5
        with self._sup_lock:
            if self._timers:
                t = min(t, max(0.0, self._timers[0][0] - time.monotonic()))
        return t

    def _read_template(self) -> None:
        if not select_read(self._conn, 0):
            return  # the event was stale: _on_pidfd already read this message
        try:
            msg, fds = _template._recv(self._conn)
        except OSError:
            msg, fds = None, []
        if msg is None:
            self._reconnect_template()
            return
        if msg[0] == "pid":
            _, req, pid = msg
            pidfd = fds[0] if fds else None
            for slot in self._slots:
                if slot.req == req and slot.state in ("starting", "ready") and slot.pidfd is None \
                        and slot.pid in (None, pid):
                    slot.pid = pid
                    slot.pidfd = pidfd
                    if pidfd is not None:
                        self._sel.register(pidfd, selectors.EVENT_READ, ("pidfd", slot.id))
                    break
            else:
                if pidfd is not None:
                    os.close(pidfd)
        elif msg[0] == "exit":
            _, pid, code = msg
            self._pending_exit[pid] = code

    def _on_pidfd(self, sid: int, pidfd: int) -> None:
        self._sel.unregister(pidfd)
        slot = self._slots[sid]
        pid = slot.pid
        deadline = time.monotonic() + EXIT_STATUS_WAIT_S
        # Only the template that forked the worker can report its status; once that
        # connection is gone (the template died, and its workers with it) stop waiting.
        while pid not in self._pending_exit and time.monotonic() < deadline and slot.via is self._conn:
            ready = select_read(self._conn, deadline - time.monotonic())
            if not ready:
                break
            self._read_template()
        exitcode = self._pending_exit.pop(pid, None) if pid is not None else None
        if exitcode is None and slot.via is not self._conn:
            exitcode = -signal.SIGKILL  # PR_SET_PDEATHSIG: it died with its template
        os.close(pidfd)
        if slot.pidfd == pidfd:
            slot.pidfd = None
        if pid is not None:
            self._deaths.append((sid, pid, exitcode))
            self._board.flag_attention()

    def _run_timers(self) -> None:
        now = time.monotonic()
        due = []
        with self._sup_lock:
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers))
        for _, _, what, sid in due:
            if what == "respawn" and not self._stopping:  # after a verdict: no breaker
                with self._lock:
                    slot = self._slots[sid]
                    if slot.state == "backing_off" and slot.pid is None:
                        self._counts["restarts"] += 1
                        self._spawn(slot, now)
                continue
            if what == "restart" and not self._stopping:
                with self._lock:
                    slot = self._slots[sid]
                    if slot.state not in ("backing_off", "open") or not slot.breaker.may_restart(now):
                        if slot.state == "open" and slot.breaker.retry_at:
                            self._add_timer(slot.breaker.retry_at, "restart", sid)
                        continue
                    self._counts["restarts"] += 1
                    self._spawn(slot, now)

    def _check_liveness(self) -> None:
        """Task timeouts and heartbeats: expiry is handled as a crash."""
        if self._board.closed:
            return
        now = time.monotonic()
        for slot in self._slots:
            if slot.state != "ready" or slot.pidfd is None or slot.kill_reason is not None:
                continue
            _, _, cur, hb, _ = self._board.slot_info(slot.id)
            if cur != slot.cur_seen:
                slot.cur_seen, slot.cur_since = cur, now
            if hb != slot.hb_seen:
                slot.hb_seen, slot.hb_since = hb, now
            if not cur:
                continue
            task = self._inflight.get(cur)
            limit = (task.options.timeout if task and task.options and task.options.timeout
                     else self._task_timeout)
            if limit and now - slot.cur_since > limit:
                self._kill(slot, ("timeout", cur, f"{limit:g}"))
            elif self._hang_timeout and now - slot.hb_since > self._hang_timeout:
                self._kill(slot, ("hung", cur, f"no heartbeat for {now - slot.hb_since:.1f} s "
                                  f"(hang_timeout={self._hang_timeout:g} s)"))

    def _check_memory(self) -> None:
        """RSS per worker (limit, leak), its cgroup's OOM counter, and system pressure."""
        now = time.monotonic()
        for slot in self._slots:
            pid = slot.pid
            if pid is None or slot.state not in ("starting", "ready") or slot.kill_reason is not None:
                continue
            if slot.mem is None or slot.mem.pid != pid:
                slot.mem = _memory.WorkerMemory(slot.id, pid)
            sample = slot.mem.sample(now)
            if sample is None:
                continue
            # A worker (or its task) may move itself to another cgroup: follow it every
            # tick, and read that cgroup's OOM counter while the worker is alive, so that
            # after a SIGKILL we compare the same cgroup's counter before and after.
            try:
                with open(f"/proc/{pid}/cgroup") as f:
                    where = f.read()
            except OSError:
                where = None
            if where != slot.cg_text or slot.cg is None:  # resolving the paths costs ~100 us
                slot.cg_text = where
                slot.cg = _memory.cgroup_of(pid)
            cg = slot.cg
            count = _memory.oom_kill_count(cg)
            if slot.pidfd is not None and not select_read(slot.pidfd, 0):
                slot.oom_before = count
            cur = self._board.current(slot.id) if slot.state == "ready" else 0
            if self._memory_limit and sample.rss_bytes > self._memory_limit:
                mib = sample.rss_bytes / 2**20
                self._kill(slot, ("memory", cur or None,
                                  f"RSS {mib:.0f} MiB over memory_limit {self._memory_limit / 2**20:.0f} MiB"))
                continue
            if slot.served >= 1 and slot.baseline is None:
                slot.baseline = sample.rss_bytes  # after the first task: imports and caches are in
            if (self._leak_threshold and slot.baseline is not None and not slot.retiring
                    and _memory.leaked(slot.baseline, sample.rss_bytes, self._leak_threshold)):
                with self._lock:
                    slot.retiring = True
                    if not slot.assigned:
                        self._retire_locked(slot)
        if self._min_available is not None:
            try:
                avail = self._available_memory()
            except Exception:  # noqa: BLE001 - a reading we cannot take pauses nothing
                return
            self._last_available = avail
            paused = avail < self._min_available
            if paused != self._paused:
                with self._lock:
                    self._paused = paused
                    if paused:
                        self._counts["paused"] += 1
                        log.warning("fastpool: available memory %d MiB is below %d MiB; dispatch "
                                    "paused", avail >> 20, self._min_available >> 20)
                    else:
                        log.warning("fastpool: memory is back (%d MiB available); dispatch resumed",
                                    avail >> 20)
                        self._dispatch_locked()

    def _kill(self, slot: _Slot, reason: tuple[str, int | None, str]) -> None:
        slot.kill_reason = reason
        if slot.pidfd is not None:
            try:
                signal.pidfd_send_signal(slot.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass

    # ---- teardown ------------------------------------------------------------------

    def _teardown(self) -> None:
        with self._lock:
            if self._stopping:
                already = True
            else:
                already = False
                self._stopping = True
                self._closed = True
                self._cancel_queued_locked()
        if already:
            self._torn_down.wait(10)
            return
        try:
            for slot in self._slots:
                if slot.state in ("ready", "starting"):  # its pid may not have arrived yet
                    slot.kill_reason = ("stop", None, "")
                    if not self._board.push_task(slot.id, K_STOP, 0, b""):
                        self._kill(slot, ("stop", None, ""))
            os.write(self._wake_w, b"x")
            self._supervisor.join(5)
            deadline = time.monotonic() + STOP_GRACE_S
            for slot in self._slots:
                if slot.pidfd is None:
                    continue
                if not select_read(slot.pidfd, max(0.0, deadline - time.monotonic())):
                    self._kill(slot, ("stop", None, ""))
                    select_read(slot.pidfd, 2.0)
                os.close(slot.pidfd)
                slot.pidfd = None
                slot.pid = None
                slot.state = "dead"
            leftovers = [t for t in self._inflight.values()]
            self._inflight.clear()
            for task in leftovers:
                try:
                    task.future.set_exception(errors.BrokenPool("the pool was shut down before this task ran"))
                except Exception:  # noqa: BLE001
                    pass
        finally:
            self._torn_down.set()
            self._board.kick()
            if threading.current_thread() is not self._collector:
                self._collector.join(5)
            others = [t for t in (self._collector, self._supervisor)
                      if t.is_alive() and t is not threading.current_thread()]
            if others:
                # A thread that still runs may be inside a wait on the board: unmapping
                # under it would crash the process.  Leave the mappings to process exit.
                log.error("fastpool: %s did not stop; the pool's shared memory stays mapped",
                          ", ".join(t.name for t in others))
            else:
                with self._drive_lock:
                    self._board.close()
                self._arena.close()
            self._sel.close()
            self._conn.close()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            _live_pools.discard(self)

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.shutdown(wait=False, cancel_futures=True)
        except Exception:  # noqa: BLE001
            pass


class TaskFunction:
    """A function with supervision options attached (see ``fastpool.task``).

    Calling it calls the function; pools read ``.options`` when it is submitted.
    It pickles by reference like the function it wraps."""

    def __init__(self, fn: Callable[..., Any], options: _policy.TaskOptions) -> None:
        self.fn = fn
        self.options = options
        self.__name__ = getattr(fn, "__name__", "task")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", None)  # type: ignore[assignment]
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (TaskFunction, (self.fn, self.options))


def task(fn: Callable[..., Any] | None = None, *, pure: bool = False, timeout: float | None = None,
         fallback: str | None = None) -> Any:
    """Decorator: ``@fastpool.task(pure=True, timeout=5, fallback="inline")``.

    Attaches supervision options to a function; every pool that runs it applies
    them (see ``Pool.options`` for their meaning).  Raises ValueError for bad options."""
    opts = _policy.TaskOptions(pure=pure, timeout=timeout, fallback=fallback)
    if fn is None:
        return lambda f: TaskFunction(f, opts)
    return TaskFunction(fn, opts)


class PoolOptions:
    """``pool.options(...)``: the same pool, with supervision options on each call."""

    def __init__(self, pool: Pool, options: _policy.TaskOptions) -> None:
        self._pool = pool
        self._options = options

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """``Pool.submit`` with these options.  Thread-safe."""
        return self._pool._submit(fn, args, kwargs, self._options)


class _FdCloser:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def _cgroup_limit(cg: dict | None) -> int | None:
    """The memory limit of one cgroup (v2 memory.max or v1 memory.limit_in_bytes)."""
    if not cg:
        return None
    for key, name in (("v2", "memory.max"), ("v1_memory", "memory.limit_in_bytes")):
        path = cg.get(key)
        if path is not None:
            try:
                value = int((path / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if value < 1 << 60:
                return value
    return None


def select_read(fd: Any, timeout: float) -> bool:
    import select

    try:
        r, _, _ = select.select([fd], [], [], max(0.0, timeout))
    except (OSError, ValueError):
        return True
    return bool(r)


def _percentiles(sorted_ns: list[int]) -> dict[str, float]:
    if not sorted_ns:
        return {}
    def at(q: float) -> float:
        return round(sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000, 1)
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0), "n": len(sorted_ns)}


Executor.register(Pool) if hasattr(Executor, "register") else None
