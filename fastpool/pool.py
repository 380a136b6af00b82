"""The public Pool: a concurrent.futures.Executor over a shared-memory board.

Data flow:

    Pool.submit / map ------> _controls.Dispatcher (compiled; its core: _dispatch):
                              pickle the call, queue it, push it to an idle
                              worker's task ring
    worker (_serve, compiled) pops, runs, pushes the result to its result ring
    Future.result() / map     the waiting thread drives: it polls the result rings,
                              returns capacity, dispatches queued work, THEN settles
    collector thread          settles what nobody waits for
    _supervisor.Supervisor    its own thread: pidfds, the template link, timers, task
                              timeouts, heartbeats, memory; a death is judged
                              (_verdict) on the thread that drives
    telemetry                 stats() and crash records

This module is the facade: it answers the public calls (``_supervision._options``
checks the constructor's options).  A
pool's life (building its parts, shutdown, interrupt, teardown, at exit, after
fork) is ``_supervision._lifetime``, whose ``Runtime`` never holds the Pool
object, so a pool dropped without ``shutdown`` is collected and shuts itself
down, after the work it accepted settles (a map iterator holds its pool; the
map engine is ``_runtime._mapper``).
"""

from __future__ import annotations

import signal
from concurrent.futures import Executor, Future
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Literal,
    ParamSpec,
    Sequence,
    SupportsIndex,
    TypeVar,
    Union,
    overload,
)

from fastpool import errors, telemetry
from fastpool._native import _ndarray
from fastpool._pool_options import PoolOptions
from fastpool._runtime import _arrays, _template
from fastpool._runtime._call import TaskFunction, task  # noqa: F401 (fastpool.pool.task)
from fastpool._runtime._lazy import LazyModule
from fastpool._supervision import _broadcast, _options, _policy, _sizing, _teardown

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, DTypeLike, NDArray

    from fastpool._integrations import _progress
    from fastpool._integrations._aio import AsyncMap
    from fastpool._runtime import _mapper
else:  # the map engine and its progress bar: imported by the first map, not the first pool
    _mapper = LazyModule("fastpool._runtime._mapper")
    _progress = LazyModule("fastpool._integrations._progress")

P = ParamSpec("P")
R = TypeVar("R")
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
S = TypeVar("S", bound="np.generic")
ShapeLike = Union[SupportsIndex, Sequence[SupportsIndex]]

DEFAULT_RING_BYTES = 64 << 20  # per direction per worker; sparse, only touched pages cost


class Pool(Executor):
    """A process pool for NumPy batch work: fast hops, supervised workers.

    ``Pool(workers=None, *, initializer=None, initargs=(), max_queue=None,
    on_full="block", task_timeout=None, hang_timeout=60.0, ...)``: see the
    argument table in docs/api.md.  ``workers=None`` or ``"auto"`` sizes the pool to
    the CPUs this process may use (affinity and cgroup quota) and, with
    ``memory_limit``, to the memory it may use.

    Raises ValueError/TypeError for bad options, SerializationError when
    ``initargs`` cannot be pickled, RuntimeError when the worker template
    cannot start.  Every public method is thread-safe (see each docstring).
    """

    def __init__(
        self,
        workers: int | Literal["auto"] | None = None,
        *,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        max_queue: int | None = None,
        on_full: Literal["block", "reject"] = "block",
        queue_timeout: float | None = None,
        task_timeout: float | None = None,
        hang_timeout: float | None = 60.0,
        start_timeout: float = _policy.DEFAULT_START_TIMEOUT_S,
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
        max_workers: int | None = None,
    ) -> None:
        if _template.BOOTING:
            raise RuntimeError(
                "a fastpool.Pool was created while the worker template imported your main "
                'script; guard the code that creates pools with `if __name__ == "__main__":`'
            )
        workers, max_queue, settings = _options.check(
            workers=workers,
            max_workers=max_workers,
            initializer=initializer,
            on_full=on_full,
            ring_bytes=ring_bytes,
            max_queue=max_queue,
            max_tasks_per_worker=max_tasks_per_worker,
            blas_threads=blas_threads,
            max_failures=max_failures,
            task_timeout=task_timeout,
            hang_timeout=hang_timeout,
            queue_timeout=queue_timeout,
            start_timeout=start_timeout,
            memory_interval_s=memory_interval_s,
            backoff_base_s=backoff_base_s,
            backoff_cap_s=backoff_cap_s,
            breaker_open_s=breaker_open_s,
            memory_limit=memory_limit,
            leak_threshold=leak_threshold,
            min_available_memory=min_available_memory,
        )
        self._n = workers
        self._settings = settings

        def breaker() -> _policy.SlotBreaker:
            return _policy.SlotBreaker(
                max_failures, breaker_open_s, _policy.Backoff(backoff_base_s, backoff_cap_s)
            )

        # Imported before the template's fork, not after: once forked, every page the
        # import writes costs a copy-on-write fault (measured: ~2 ms slower after).
        from fastpool._supervision import _lifetime  # ~5 ms of imports a first pool pays

        # The template's start (a first pool's) overlaps what follows: nothing below
        # refuses an option.
        _template.template().begin()
        if blas_threads is None:
            blas_threads = _sizing.threads_per_worker(workers)

        self._keep: list = []  # blocks of shared arrays in initargs: live as long as the pool
        self._rt = rt = _lifetime.start(
            workers,
            initializer=initializer,
            initargs=initargs,
            blas_threads=blas_threads,
            keep=self._keep,
            ring_bytes=ring_bytes,
            arena_bytes=arena_bytes,
            max_queue=max_queue,
            on_full=on_full,
            queue_timeout=queue_timeout,
            max_tasks_per_worker=max_tasks_per_worker,
            settings=settings,
            breaker=breaker,
        )
        self._board, self._arena, self._disp, self._sup, self._tel = (
            rt.board,
            rt.arena,
            rt.disp,
            rt.sup,
            rt.tel,
        )

    # ---- public API ------------------------------------------------------------------

    @property
    def workers(self) -> int:
        """The number of worker slots (fixed for the pool's life).  Thread-safe."""
        return self._n

    @property
    def _max_workers(self) -> int:
        """``workers`` under ProcessPoolExecutor's name, which Dask's local scheduler
        reads to size itself (``dask.compute(..., scheduler=pool)``).  Read-only."""
        return self._n

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Schedules ``fn(*args, **kwargs)`` in a worker and returns its Future.

        Raises ``PoolClosed`` after ``shutdown``, ``SerializationError`` if an argument
        cannot be pickled (nothing is submitted), ``QueueFull`` when the queue is full
        and ``on_full="reject"`` (or ``queue_timeout`` passed), ``CircuitOpen`` when
        every worker slot's breaker is open.  A task that raises sets that exception
        on the future, with the worker's traceback as ``__cause__``.  Thread-safe."""
        if type(fn) is TaskFunction:
            return self._submit(fn.fn, args, kwargs, fn.options)
        return self._disp.submit(fn, args, kwargs, None)

    def asubmit(
        self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]:
        """``await pool.asubmit(fn, *args, **kwargs)``: ``submit`` for asyncio (docs/asyncio.md).

        Nothing happens until it is awaited.  While the queue is full the coroutine
        waits for room without blocking the event loop.  Returns the task's result or
        raises what ``submit`` and ``Future.result()`` raise (a pool-side
        cancellation is ``concurrent.futures.CancelledError``).  Cancelling the
        awaiting task cancels the pool task by ``cancel``'s rules: dropped if it has
        not started, else its cancel flag is set (``options(force_cancel=True)``:
        its worker is killed).  Thread-safe; each call belongs to the running loop."""
        from fastpool._integrations import _aio

        return _aio.submit(self, fn, args, kwargs, None, False)

    def _submit(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, options: _policy.TaskOptions | None
    ) -> Future:
        try:
            return self._disp.submit(fn, args, kwargs, options)
        except errors.CircuitOpen:
            if options is None or options.fallback != "inline":
                raise
        return self._disp.run_inline(fn, args, kwargs)  # degraded mode: this process runs it

    def options(
        self,
        *,
        pure: bool = False,
        timeout: float | None = None,
        fallback: Literal["inline"] | None = None,
        force_cancel: bool = False,
    ) -> "PoolOptions":
        """A view of this pool whose ``submit`` applies these supervision options.

        ``pure=True``: a task whose worker crashed is re-run once on a fresh worker;
        if it kills a second one it fails with ``PoisonTask``.  ``timeout``: run time
        limit (``TaskTimeout``).  ``fallback="inline"``: run in the calling process
        when the pool cannot serve (every breaker open).  Options travel beside the
        call, so they never collide with the function's own keyword arguments.
        ``force_cancel=True``: cancelling a task awaiting the view's ``asubmit``
        kills a running task's worker (``cancel(fut, force=True)``) instead of
        setting its flag.  Raises ValueError for bad options.  Thread-safe; the
        view may be shared."""
        return PoolOptions(
            self, _policy.TaskOptions(pure=pure, timeout=timeout, fallback=fallback), force_cancel
        )

    def cancel(self, future: Future[Any], *, force: bool = False) -> bool:
        """Stops a task if it can without the task's help; else asks the task to stop.

        True when the task is stopped by this call: queued or prefetched (a worker holds
        it but has not started it), it is dropped and never runs, and the future is
        cancelled now; running with ``force=True``, its worker is killed and replaced, and
        the future is cancelled as soon as the death is seen (``result()`` waits for that,
        not for the task).  False when the future had already settled, and when the
        task is running and ``force=False``: then only a flag is set, which the task can
        poll with ``fastpool.cancelled()``.  The future stays running until the task
        returns, and then ends cancelled (its result dropped); a task that never polls
        runs to its end, and ``shutdown(wait=True)`` or a ``with`` block waits for it.
        ``force=True`` stops it.  A cancelled future behaves as ``Future.cancel()``
        leaves it (``cancelled()`` True, ``result()`` raises ``CancelledError``).
        Raises TypeError for a future of another pool.  Thread-safe."""
        if getattr(future, "_disp", None) is not self._disp:
            raise TypeError("pool.cancel() takes a future this pool returned")
        if future.cancel():
            return True
        outcome, slot = self._disp.cancel(future, force)
        if outcome == "kill":
            self._sup.kill_for_cancel(slot, future._task.wire)  # type: ignore[attr-defined]
        return outcome in ("cancelled", "dropping", "kill")

    # Narrower than Executor.map on purpose: at least one iterable (none is a TypeError
    # at run time anyway), and fn's parameters checked against the iterables' items.
    @overload  # type: ignore[override]
    def map(
        self,
        fn: Callable[[T1], R],
        it1: Iterable[T1],
        /,
        *,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        buffersize: int | None = ...,
        progress: _progress.ProgressArg = ...,
    ) -> Iterator[R]: ...
    @overload
    def map(
        self,
        fn: Callable[[T1, T2], R],
        it1: Iterable[T1],
        it2: Iterable[T2],
        /,
        *,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        buffersize: int | None = ...,
        progress: _progress.ProgressArg = ...,
    ) -> Iterator[R]: ...
    @overload
    def map(
        self,
        fn: Callable[[T1, T2, T3], R],
        it1: Iterable[T1],
        it2: Iterable[T2],
        it3: Iterable[T3],
        /,
        *,
        timeout: float | None = ...,
        chunksize: int | None = ...,
        buffersize: int | None = ...,
        progress: _progress.ProgressArg = ...,
    ) -> Iterator[R]: ...
    @overload
    def map(
        self,
        fn: Callable[..., R],
        it1: Iterable[Any],
        it2: Iterable[Any],
        it3: Iterable[Any],
        it4: Iterable[Any],
        /,
        *iterables: Iterable[Any],
        timeout: float | None = ...,
        chunksize: int | None = ...,
        buffersize: int | None = ...,
        progress: _progress.ProgressArg = ...,
    ) -> Iterator[R]: ...

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        buffersize: int | None = None,
        progress: _progress.ProgressArg = None,
    ) -> Iterator[Any]:
        """Like ``Executor.map``, but lazy: at most a window of chunks is in flight.

        Results come in input order; the first exception raised by ``fn`` is raised
        when its position is reached (results before it are yielded first).
        ``chunksize=None`` picks one from the input length (or adapts to the measured
        run time when the length is unknown).  ``buffersize`` (Python 3.14's
        ``Executor.map`` argument, on every Python): at most that many chunks are
        submitted ahead of the consumer (default: a window sized to the pool);
        TypeError if it is not an int, ValueError if it is below 1.  ``timeout``
        counts from this call; on ``TimeoutError``, an error, or when the iterator
        is closed or dropped early, the chunk waited for and those not yet run are
        cancelled (never run later).  The iterator keeps the pool alive, and
        forgets each result once it is handed out.  ``progress``: True or "tqdm"
        (``tqdm.auto``), "rich", or a ``callable(done, total)`` counting finished
        items (docs/asyncio.md, "Progress bars"); ImportError naming the extra when
        tqdm is missing.  Raises PoolClosed, SerializationError as ``submit``.
        Thread-safe to call; each iterator belongs to one consuming thread."""
        return self._map(fn, iterables, True, chunksize, timeout, buffersize, progress)

    def imap_unordered(
        self,
        fn: Callable[[T1], R],
        iterable: Iterable[T1],
        chunksize: int | None = None,
        *,
        buffersize: int | None = None,
        progress: _progress.ProgressArg = None,
    ) -> Iterator[R]:
        """Like ``map`` for one iterable, yielding results as their chunks complete.

        An exception from ``fn`` is raised when its chunk completes.  ``buffersize``
        and ``progress`` as for ``map``.  Thread-safe to call; each iterator
        belongs to one consuming thread."""
        return self._map(fn, (iterable,), False, chunksize, None, buffersize, progress)

    def _map(
        self,
        fn: Callable[..., Any],
        iterables: tuple,
        ordered: bool,
        chunksize: int | None,
        timeout: float | None,
        buffersize: int | None,
        progress: _progress.ProgressArg,
    ) -> Iterator[Any]:
        run = _mapper.MapRun(
            self,
            fn,
            iterables,
            chunksize=chunksize,
            timeout=timeout,
            buffersize=buffersize,
            bar=progress is not None,
        )
        if progress is not None:
            counter = _progress.open_counter(
                progress, _progress.total_of(iterables), getattr(run.fn, "__name__", None)
            )
            if counter is not None:
                run.on_submit = lambda fut: fut.add_done_callback(counter.chunk_done)
                run.on_end = counter.close  # the bar closes however the stream ends
        return _mapper.MapIterator.over(run.start(ordered))

    @overload
    def amap(
        self,
        fn: Callable[[T1], R],
        it1: Iterable[T1],
        /,
        *,
        chunksize: int | None = ...,
        ordered: bool = ...,
        force_cancel: bool = ...,
        progress: _progress.ProgressArg = ...,
    ) -> AsyncMap[R]: ...
    @overload
    def amap(
        self,
        fn: Callable[[T1, T2], R],
        it1: Iterable[T1],
        it2: Iterable[T2],
        /,
        *,
        chunksize: int | None = ...,
        ordered: bool = ...,
        force_cancel: bool = ...,
        progress: _progress.ProgressArg = ...,
    ) -> AsyncMap[R]: ...
    @overload
    def amap(
        self,
        fn: Callable[[T1, T2, T3], R],
        it1: Iterable[T1],
        it2: Iterable[T2],
        it3: Iterable[T3],
        /,
        *,
        chunksize: int | None = ...,
        ordered: bool = ...,
        force_cancel: bool = ...,
        progress: _progress.ProgressArg = ...,
    ) -> AsyncMap[R]: ...
    @overload
    def amap(
        self,
        fn: Callable[..., R],
        it1: Iterable[Any],
        it2: Iterable[Any],
        it3: Iterable[Any],
        it4: Iterable[Any],
        /,
        *iterables: Iterable[Any],
        chunksize: int | None = ...,
        ordered: bool = ...,
        force_cancel: bool = ...,
        progress: _progress.ProgressArg = ...,
    ) -> AsyncMap[R]: ...

    def amap(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        chunksize: int | None = None,
        ordered: bool = True,
        force_cancel: bool = False,
        progress: _progress.ProgressArg = None,
    ) -> AsyncMap[Any]:
        """``async for r in pool.amap(fn, items)``: ``map`` for asyncio (docs/asyncio.md).

        Results in input order, or as chunks finish with ``ordered=False`` (one
        iterable only).  A window of chunks is in flight; a full queue makes it
        wait without blocking the loop.  A failing item's exception is raised at
        its position, after the results before it.  Ending early (``break``,
        ``aclose()``, leaving ``async with``, cancellation, an error) cancels the
        chunks not finished by ``cancel``'s rules (``force_cancel=True``: running
        ones are killed).  ``progress`` as for ``map``.  Raises PoolClosed,
        TypeError, ValueError at once; the input is read as chunks are submitted.
        Each iterator belongs to one task on one loop."""
        from fastpool._integrations import _aio

        return _aio.AsyncMap(self, fn, iterables, chunksize, ordered, force_cancel, progress)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops taking work, then tears the pool down once accepted work settles.

        ``cancel_futures=True`` cancels tasks not yet handed to a worker.  With
        ``wait=True`` this returns after every accepted task settled and every worker
        exited; with ``wait=False`` the teardown happens in the background.  Tasks
        still unsettled when the pool is torn down fail with ``BrokenPool``; a worker
        that ignores the stop request is SIGKILLed after 2 s.  Without ``shutdown``,
        a pool finishes its accepted work too: when it is dropped (map iterators
        keep it alive) and at interpreter exit, which waits for that work as
        ProcessPoolExecutor's does (Ctrl-C stops it within about a second).  Never
        raises for a pool already shut down.  Idempotent and thread-safe."""
        self._rt.shutdown(wait, cancel_futures)

    def terminate_workers(self) -> None:
        """Python 3.14's ``ProcessPoolExecutor.terminate_workers()``, on every Python:
        ``shutdown(wait=False, cancel_futures=True)``, then SIGTERM to every live worker.

        A task a worker was running fails with ``WorkerCrashed`` (a ``BrokenProcessPool``);
        tasks a worker held but had not started fail with ``BrokenPool``, queued ones are
        cancelled: none of them runs, and no replacement worker starts.  Later ``submit``
        raises ``PoolClosed``.  Returns without waiting; idempotent and thread-safe."""
        self._force_shutdown(operation="terminate")

    def kill_workers(self) -> None:
        """Python 3.14's ``ProcessPoolExecutor.kill_workers()``: as ``terminate_workers``,
        with SIGKILL.  Thread-safe."""
        self._force_shutdown(operation="kill")

    # ProcessPoolExecutor's private name and signature (3.14): its own tests of
    # terminate_workers()/kill_workers() patch it and call it
    _FORCE_SHUTDOWN = {"terminate": signal.SIGTERM, "kill": signal.SIGKILL}

    def _force_shutdown(self, operation: str) -> None:
        if operation not in self._FORCE_SHUTDOWN:
            raise ValueError(f"Unsupported operation: {operation!r}")
        sig = self._FORCE_SHUTDOWN[operation]
        # the queue first, as ProcessPoolExecutor does: nothing queued reaches a worker
        # that is about to die; then each death is judged as forced (nothing requeued)
        self.shutdown(wait=False, cancel_futures=True)
        _teardown.force_stop(self._sup, sig, f"Pool.{operation}_workers() sent {sig.name}")

    def drain(self) -> None:
        """Settles every accepted task (none is cancelled or lost), then tears down.

        Equivalent to ``shutdown(wait=True, cancel_futures=False)``.  Thread-safe."""
        self.shutdown(wait=True, cancel_futures=False)

    def __enter__(self) -> "Pool":
        """Returns the pool.  Thread-safe."""
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """``shutdown(wait=True)``; on Ctrl-C (KeyboardInterrupt) or SystemExit, stops
        at once instead: queued tasks are cancelled, running ones interrupted (SIGINT
        in their worker, SIGKILL after a short grace), within about a second.
        Thread-safe; never raises for a pool already shut down."""
        if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            self._rt.interrupt()
        else:
            self.shutdown(wait=True)

    def __del__(self) -> None:
        # A pool nobody references any more (its map iterators hold it) still
        # finishes the work it accepted, as concurrent.futures promises: the
        # collector thread settles the pending futures, then tears the pool down.
        rt = getattr(self, "_rt", None)
        if rt is not None and not rt.disp.closed:
            try:
                rt.shutdown(wait=False, cancel_futures=False)
            except Exception:  # noqa: BLE001 - a finalizer must not raise
                pass

    @overload
    def run_on_workers(
        self,
        fn: Callable[..., R],
        /,
        *args: Any,
        timeout: float | None = ...,
        on_error: Literal["raise", "ignore"] = ...,
        **kwargs: Any,
    ) -> dict[int, R]: ...
    @overload
    def run_on_workers(
        self,
        fn: Callable[..., R],
        /,
        *args: Any,
        timeout: float | None = ...,
        on_error: Literal["return"],
        **kwargs: Any,
    ) -> dict[int, R | BaseException]: ...

    def run_on_workers(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        timeout: float | None = None,
        on_error: Literal["raise", "return", "ignore"] = "raise",
        **kwargs: Any,
    ) -> dict[int, Any]:
        """Runs ``fn(*args, **kwargs)`` once in every live worker; ``{slot: result}``.

        Keyed by worker slot (0 to ``workers - 1``, ``WorkerCrashed.worker_id``); the
        state an ``initializer`` built is the worker's module globals (docs/state.md).
        A slot whose worker is starting gets the call once it is ready; one with no
        worker (backing off, breaker open) is left out.  A busy worker runs it after
        the tasks it holds, before work queued later.  A worker that dies before the
        call returns fails it with ``WorkerCrashed`` (the state died with it; the call
        never runs on the replacement).  ``on_error="raise"`` raises the first slot's
        exception once every call settled, ``"return"`` puts it in the dict,
        ``"ignore"`` leaves the slot out.  ``timeout``: TimeoutError, calls not started
        are dropped, running ones flagged (``fastpool.cancelled()``).  PoolClosed after
        shutdown, SerializationError as ``submit``.  Thread-safe."""
        return _broadcast.run_on_workers(self._sup, self._disp, fn, args, kwargs, timeout, on_error)

    def pids(self) -> list[int]:
        """The pids of the live workers right now (for tests and monitoring).

        A snapshot: a worker may die or be replaced the moment after.  Thread-safe."""
        return self._sup.pids()

    def stats(self) -> dict[str, Any]:
        """A snapshot: counts, per-worker state, queue depth and latency percentiles.

        Calls (``calls_submitted``, ``calls_completed``, ``calls_failed``,
        ``calls_cancelled``), map chunks (``chunks_submitted``, ``chunks_completed``,
        ...) and the items of completed chunks (``items_completed``) are counted apart;
        ``crashed`` counts deaths nobody asked for, ``killed`` the kills fastpool
        made (timeout, memory, hang, forced cancel, damage).  ``arena`` says what the
        shared arena holds, in bytes: ``held_bytes`` (its pages in memory now),
        ``live_bytes`` (in blocks in use), ``free_bytes`` (freed, warm or given back),
        ``reserve_bytes`` (the most idle trims keep warm), ``returned_bytes`` (what trims
        gave back so far), ``high_water_bytes`` and ``budget_bytes`` (docs/arrays.md).
        Thread-safe; cheap enough to call once a second."""
        disp, sup = self._disp, self._sup
        out: dict[str, Any] = {**disp.counts(), **self._tel.counts()}
        waits, runs = disp.samples()
        out.update(
            queued=disp.queued,
            inflight=disp.inflight,
            prefetch=disp.depth,
            closed=disp.closed,
            workers=sup.worker_stats(not self._board.closed),
            dispatch_paused=sup.memory.paused,
            available_memory_bytes=sup.memory.last_available,
            memory_limit_bytes=self._settings["memory_limit"],
            crashes=self._tel.crashes(),
            arena=self._arena.memory(),
            latency={
                "queue_wait_us": telemetry.percentiles(waits),
                "run_us": telemetry.percentiles(runs),
            },
        )
        return out

    # ---- the internal API of the map engine (_runtime._mapper) and of asyncio (_aio) ----
    # Every method is thread-safe.  Nothing else outside this module touches the
    # pool's private fields.

    def _map_sizing(self) -> _mapper.Sizing:
        if self._disp.closed:
            raise errors.PoolClosed()
        return _mapper.Sizing(self._n)

    def _submit_chunk(
        self, fn: Callable[..., Any], chunk: Any, star: bool, wait: bool = True, *, memo: Any = None
    ) -> Future:
        """A map chunk as one task; ``wait=False`` raises QueueFull instead of
        waiting for room; ``memo``: the map's copies (``_mapper.MapTarget``)."""
        return self._disp.submit_chunk(fn, chunk, star, wait, memo)

    def _submit_nowait(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, options: Any
    ) -> Future:
        """``submit`` that raises QueueFull instead of waiting, and never runs inline."""
        return self._disp.submit(fn, args, kwargs, options, False)

    def _chunk_seconds(self, fut: Future) -> float:
        return fut._task.run_ns * 1e-9  # type: ignore[attr-defined, no-any-return]

    def _wait_any(self, pending: Any, done: Any, timeout: float | None) -> None:
        # The consumer drives, as a thread in result() does: no hand-off to the collector
        self._disp.drive(lambda: bool(done), timeout)

    def _cancel_chunk(self, fut: Future) -> None:
        try:
            self.cancel(fut)
        except Exception:  # noqa: BLE001 - a torn-down pool has settled it already
            pass

    def _has_room(self) -> bool:
        """The queue has room now (a submit would not wait)."""
        return bool(self._disp.queued < self._disp.max_queue)

    def _drive(self, until: Callable[[], bool], timeout: float | None) -> None:
        """Consumes results and settles futures on this thread until ``until()``
        holds, the pool is torn down, or ``timeout`` passes."""
        self._disp.drive(until, timeout)

    def _torn_down(self) -> bool:
        return bool(self._disp.torn_down)

    def _closed(self) -> bool:
        """True once shutdown began: the pool takes no new work (the joblib backend's
        pool cache replaces such a pool).  Thread-safe."""
        return bool(self._disp.closed)

    # ---- shared arrays -------------------------------------------------------------

    @overload
    def empty(
        self, shape: ShapeLike, dtype: None = ..., order: Literal["C", "F"] = ...
    ) -> NDArray[np.float64]: ...
    @overload
    def empty(
        self, shape: ShapeLike, dtype: type[S] | np.dtype[S], order: Literal["C", "F"] = ...
    ) -> NDArray[S]: ...
    @overload
    def empty(
        self, shape: ShapeLike, dtype: DTypeLike, order: Literal["C", "F"] = ...
    ) -> NDArray[Any]: ...

    def empty(
        self, shape: ShapeLike, dtype: DTypeLike | None = float, order: Literal["C", "F"] = "C"
    ) -> NDArray[Any]:
        """An uninitialised ndarray in this pool's shared memory (docs/arrays.md).

        Passing it, or any view of it, to a task moves a descriptor, not bytes; the
        worker sees the same memory.  Raises SharedMemoryError (saying what is free)
        when it cannot fit, TypeError for object dtypes, PoolClosed after shutdown.
        Thread-safe."""
        self._arrays_open()
        return _ndarray.new_array(self._arena, shape, dtype, order)

    @overload
    def zeros(
        self, shape: ShapeLike, dtype: None = ..., order: Literal["C", "F"] = ...
    ) -> NDArray[np.float64]: ...
    @overload
    def zeros(
        self, shape: ShapeLike, dtype: type[S] | np.dtype[S], order: Literal["C", "F"] = ...
    ) -> NDArray[S]: ...
    @overload
    def zeros(
        self, shape: ShapeLike, dtype: DTypeLike, order: Literal["C", "F"] = ...
    ) -> NDArray[Any]: ...

    def zeros(
        self, shape: ShapeLike, dtype: DTypeLike | None = float, order: Literal["C", "F"] = "C"
    ) -> NDArray[Any]:
        """Like ``empty``, filled with zeros; fails like ``empty``.  Thread-safe."""
        self._arrays_open()
        return _ndarray.new_array(self._arena, shape, dtype, order, True)

    @overload
    def share(self, arr: NDArray[S], readonly: bool = ...) -> NDArray[S]: ...
    @overload
    def share(self, arr: ArrayLike, readonly: bool = ...) -> NDArray[Any]: ...

    def share(self, arr: ArrayLike, readonly: bool = False) -> NDArray[Any]:
        """A copy of ``arr`` in this pool's shared memory (the one copy in).

        ``readonly=True``: the copy, and every view of it a worker receives, is not
        writeable.  Errors as for ``empty``.  Thread-safe."""
        self._arrays_open()
        return _ndarray.share(self._arena, arr, readonly)

    def arrays(self) -> _arrays.ArraysContext:
        """``with pool.arrays():`` NumPy arrays of 1 MiB or more made in this thread are
        born in this pool's shared memory and cross to its tasks like ``pool.empty``'s,
        with no copy; they stay valid after the block and the pool end (docs/arrays.md).

        Never fails an allocation: what the arena cannot serve (full, shut down, a
        forked child) falls back to NumPy's allocator, and is copied when sent.  Raises
        PoolClosed after shutdown.  Covers the calling thread's context only.
        Thread-safe."""
        self._arrays_open()
        return _arrays.ArraysContext(self._arena)

    def _arrays_open(self) -> None:
        if self._disp.closed:
            raise errors.PoolClosed(
                "this pool was shut down: its shared memory takes no new arrays"
            )
