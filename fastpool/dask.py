"""fastpool on a Dask distributed cluster: ``FastpoolPlugin`` and ``Executor``.

    your process                      Dask scheduler            each Dask worker (one per host)
    ------------                      --------------            -------------------------------
    Executor.submit / map -------->   one task per call     --> a Dask thread: run_call/run_chunk
      unique key, retries=0           (or per map chunk)          -> worker's fastpool.Pool (plugin)
    concurrent.futures.Future <-----  result or TaskFailed  <--      -> child process runs fn
      settled on the executor's                              scattered arrays: pool.share once
      own thread, errors unwrapped                           per worker per key, then descriptors

Needs the optional extra: ``pip install 'fastpool[dask]'``.  See docs/dask.md.  Dask
itself schedules, moves data and restarts workers; fastpool supervises the processes on
each host and names every failure.
"""

from __future__ import annotations

try:
    import dask
    import distributed
    from distributed import Client
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fastpool.dask needs Dask's `distributed` package, which is an optional extra: "
        f"pip install 'fastpool[dask]' ({_exc})"
    ) from _exc

import concurrent.futures as cf
import contextlib
import queue
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Iterator

from fastpool import errors
from fastpool._integrations._dask_worker import (
    Call,
    FastpoolPlugin,
    ScatterRef,
    TaskFailed,
    describe_settings,
    plugin_settings,
    pool_stats,
    run_call,
    run_chunk,
    swap,
)
from fastpool._runtime import _mapper
from fastpool._runtime._call import ChunkFailure

__all__ = [
    "Executor",
    "ExecutorOptions",
    "FastpoolPlugin",
    "ScatteredArray",
    "DaskWorkerCrashed",
    "DaskWorkerMemoryError",
    "DaskRemoteTraceback",
]

TARGET_CHUNK_S = 0.05  # a Dask task costs ~1-3 ms; a chunk of ~50 ms makes that small
FIRST_CHUNKSIZE = 16  # input without a length: the first chunks, before any timing


class DaskRemoteTraceback(Exception):
    """The remote traceback (fastpool child, then Dask worker), as ``__cause__``."""

    def __init__(self, text: str, worker: str | None = None, key: str | None = None) -> None:
        super().__init__(text, worker, key)
        self.text, self.worker, self.key = text, worker, key

    def __str__(self) -> str:
        return f'task {self.key} on Dask worker {self.worker}\n"""\n{self.text}"""'


class DaskWorkerCrashed(errors.WorkerCrashed):
    """The Dask worker (not a fastpool child) died or closed while it ran this task.

    ``address`` is that worker; Dask's own error (``KilledWorker``, say) is the
    ``__cause__``.  Dask reruns a task whose worker died on other workers up to
    ``distributed.scheduler.allowed-failures`` times before it reports this."""

    cause = "dask-worker"

    def __init__(self, address: str | None, detail: str = "", key: str | None = None) -> None:
        super().__init__(-1, None, None, None, detail)
        self.args = (address, detail, key)
        self.address, self.key = address, key

    def _ending(self) -> BaseException | None:
        return None  # no process of fastpool's ended; Dask's error is the cause, set by the caller

    def __str__(self) -> str:
        return (
            f"Dask worker {self.address} died or closed while running task {self.key}; "
            f"{self.detail}"
        )


class DaskWorkerMemoryError(DaskWorkerCrashed, errors.WorkerMemoryError):
    """Dask's nanny restarted the Dask worker for memory while it ran this task.

    Told apart from other deaths by the nanny's ``worker-restart-memory`` event
    (``client.get_events``); ``rss_bytes`` is what the nanny measured.  Only the Dask
    worker process counts there: a fastpool child over its own ``memory_limit``
    fails with a plain ``WorkerMemoryError`` instead."""

    cause = "memory"

    def __init__(
        self,
        address: str | None,
        detail: str = "",
        key: str | None = None,
        rss_bytes: int | None = None,
    ) -> None:
        super().__init__(address, detail, key)
        self.args = (address, detail, key, rss_bytes)
        self.reason, self.rss_bytes = "dask-nanny", rss_bytes

    def __str__(self) -> str:
        rss = "?" if self.rss_bytes is None else f"{self.rss_bytes / 2**20:.0f} MiB"
        return (
            f"Dask's nanny restarted worker {self.address} for memory (RSS {rss}) while it ran "
            f"task {self.key}; {self.detail}"
        )


class ScatteredArray:
    """An array sent to the cluster once by ``Executor.scatter``; pass it as an argument.

    On each Dask worker the first task that names it copies it into the worker's
    fastpool shared memory (read-only); every later task there, in any child, gets
    a descriptor of that copy: no transfer, no pickle.  ``release()`` (or dropping
    the last reference) frees it on the cluster."""

    def __init__(self, future: distributed.Future, shape: tuple, dtype: Any, nbytes: int) -> None:
        self.future, self.shape, self.dtype, self.nbytes = future, shape, dtype, nbytes

    @property
    def key(self) -> str:
        return str(self.future.key)

    def release(self) -> None:
        """Lets the cluster drop the array once no task needs it.  Thread-safe."""
        self.future.release()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a ScatteredArray can be passed to Executor.submit/map as an argument (also inside "
            "lists, tuples, dicts or functools.partial), not inside other objects"
        )

    def __repr__(self) -> str:
        return f"<ScatteredArray {self.key} shape={self.shape} dtype={self.dtype}>"


class _ClusterFuture(cf.Future):
    """A real ``concurrent.futures.Future``; cancelling it also cancels the Dask task,
    and a call already running is stopped (its child is killed and replaced)."""

    def __init__(self, executor: "Executor", dfut: distributed.Future) -> None:
        super().__init__()
        self._executor, self._dfut = executor, dfut
        self._partial: list | None = None  # a map chunk's results before its failing item
        self._run_s: float | None = None  # a map chunk's run time in its child
        self._chunk = False  # a map chunk: its value is (results, run time)

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        super().set_running_or_notify_cancel()  # wakes wait() and as_completed()
        self._executor._cancel_remote([self._dfut])
        self._executor._count("cancelled")
        return True


def _check_plugin(client: Client, name: str, wanted: dict | None) -> None:
    """Fails loudly where Dask would be silent: a plugin of that name missing, or (the
    plugin being idempotent) an earlier one with other settings kept in place of ours."""
    found = client.run(plugin_settings, name)
    missing = sorted(a for a, kw in found.items() if kw is None)
    if missing:
        raise ValueError(
            f"no FastpoolPlugin named {name!r} on Dask workers {missing}; create the "
            "executor with install=True, or register fastpool.dask.FastpoolPlugin"
        )
    other = {a: kw for a, kw in found.items() if wanted is not None and kw != wanted}
    if other:
        raise ValueError(
            f"a FastpoolPlugin named {name!r} with other settings is already on the cluster "
            f"({next(iter(other.values()))}, not {wanted}); Dask keeps the first one. Use another "
            f"name, or client.unregister_worker_plugin({name!r}) first"
        )


def _check_options(pure: bool, timeout: float | None, fallback: str | None) -> dict | None:
    if not isinstance(pure, bool):
        raise TypeError(f"pure must be a bool, not {pure!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
    if fallback not in (None, "inline"):
        raise ValueError(f"fallback must be None or 'inline', not {fallback!r}")
    opts = {k: v for k, v in (("pure", pure), ("timeout", timeout), ("fallback", fallback)) if v}
    return opts or None


class Executor(cf.Executor):
    """``fastpool.Pool``'s API on a Dask cluster: each call runs in a fastpool child on
    some Dask worker.

    ``Executor(client, *, name="fastpool", install=True, window=None, **pool_kwargs)``:
    ``client`` is a ``distributed.Client``.  With ``install=True`` the
    ``FastpoolPlugin(name, **pool_kwargs)`` is registered on the cluster; if one by
    that name with other settings is there already, Dask would keep it silently, so
    this raises ``ValueError``.  ``install=False`` uses the plugin already registered
    (``ValueError`` if a worker has none).  ``window``: chunks a ``map`` keeps in flight
    (default: ``Pool.map``'s window, the cluster's threads counted as workers).

    Every call is one Dask task with a unique key (never merged with an equal call)
    and ``retries=0``: fastpool decides retries (``options(pure=True)``).  A Dask
    worker that dies is Dask's business: its scheduler reruns the task elsewhere up to
    ``allowed-failures`` times, then this executor reports ``DaskWorkerCrashed``, or
    ``DaskWorkerMemoryError`` if the nanny restarted it for memory.

    Futures are ``concurrent.futures.Future`` (``as_completed``, ``wait`` and
    ``asyncio.wrap_future`` work).  They are settled, and done-callbacks run, on this
    executor's own thread, never on Dask's event loop.  A task's exception arrives as
    itself; fastpool's (``WorkerCrashed``, ``TaskTimeout``, ``WorkerMemoryError``,
    ``PoisonTask``...) as themselves; in both cases ``__cause__`` is a
    ``DaskRemoteTraceback`` with the child's and the Dask worker's tracebacks.

    Raises ``TypeError`` for arguments ``fastpool.Pool`` does not take, and what
    ``client.register_plugin`` raises when a worker cannot create its pool.
    Thread-safe: ``submit``, ``map``, ``stats`` and ``shutdown`` may be called from
    any thread (not from Dask's event loop).
    """

    def __init__(
        self,
        client: Client,
        *,
        name: str = "fastpool",
        install: bool = True,
        window: int | None = None,
        **pool_kwargs: Any,
    ) -> None:
        if not isinstance(client, Client):
            raise TypeError(f"client must be a distributed.Client, not {type(client).__name__}")
        if client.asynchronous:
            raise TypeError(
                "fastpool.dask.Executor needs a synchronous Client (asynchronous=False)"
            )
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive int or None, not {window!r}")
        if install:
            client.register_plugin(FastpoolPlugin(name, **pool_kwargs))
        elif pool_kwargs:
            raise TypeError(
                "pool arguments apply only when this executor installs the plugin (install=True)"
            )
        _check_plugin(client, name, describe_settings(pool_kwargs) if install else None)
        self._client, self._name, self._window = client, name, window
        self._lock = threading.Lock()
        self._closed = False
        self._outstanding: dict[_ClusterFuture, float] = {}  # future -> submit time
        self._counts = dict(
            submitted=0, completed=0, failed=0, cancelled=0, chunks=0, map_window_max=0
        )
        self._settled: queue.SimpleQueue = queue.SimpleQueue()
        self._settler = threading.Thread(
            target=self._settle_loop, daemon=True, name=f"fastpool-dask-settle-{name}"
        )
        self._settler.start()

    # ---- public API ------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """Schedules ``fn(*args, **kwargs)`` in a fastpool child on the cluster.

        Raises ``PoolClosed`` after ``shutdown`` and ``SerializationError`` when the
        call cannot be pickled (nothing is submitted).  Failures of the call arrive on the
        future (see the class docstring).  Thread-safe."""
        return self._submit(run_call, fn, args, kwargs, None)

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """Like ``Executor.map``, but lazy and chunked: one Dask task per chunk, at most
        ``buffersize`` (else ``window``, else the map engine's window) chunks in
        flight, results in input order.  The same engine as ``fastpool.Pool.map``.

        ``chunksize=None``: the first chunks hold FIRST_CHUNKSIZE items, one per
        cluster thread; then each aims at ~50 ms of work (at most 8192 items), as
        ``fastpool.Pool.map``'s do at 2 ms (docs/tuning.md).  If ``fn`` raises, the
        results before the failing item are yielded, then the exception is raised.
        ``timeout`` counts from this call; on a timeout, or when the iterator is
        closed early, the chunk waited for and those not done are cancelled.  Raises
        PoolClosed after ``shutdown``, ValueError/TypeError for a bad chunksize or
        buffersize.  Thread-safe to call; each iterator belongs to one thread."""
        return self._map(fn, iterables, timeout, chunksize, buffersize, None, ordered=True)

    def imap_unordered(
        self,
        fn: Callable[..., Any],
        iterable: Iterable[Any],
        chunksize: int | None = None,
        *,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """Like ``map`` over one iterable, with results in completion order (per chunk).
        Thread-safe to call; each iterator belongs to one thread."""
        return self._map(fn, (iterable,), None, chunksize, buffersize, None, ordered=False)

    def options(
        self, *, pure: bool = False, timeout: float | None = None, fallback: str | None = None
    ) -> "ExecutorOptions":
        """A view whose ``submit``/``map``/``imap_unordered`` apply fastpool's options
        in the child's pool: ``pure=True`` reruns a call whose child crashed once
        (then ``PoisonTask``); ``timeout`` kills the child after that many seconds
        (``TaskTimeout``), and applies to each map chunk; ``fallback="inline"`` runs
        the call in the Dask worker itself when every breaker of its pool is open.
        Raises ValueError/TypeError for bad options.  Thread-safe."""
        return ExecutorOptions(self, _check_options(pure, timeout, fallback))

    def scatter(self, arr: Any, *, broadcast: bool = False) -> ScatteredArray:
        """Sends the NumPy array ``arr`` to the cluster once and returns its handle.

        ``broadcast=True`` sends it to every Dask worker now; otherwise to one, and
        the others fetch it once, when their first task needs it.  Tasks that take
        the handle as an argument get the array (read-only) from their host's shared
        memory.  Raises ``TypeError`` for anything but a non-object ndarray, and
        ``PoolClosed`` after ``shutdown``.  Thread-safe."""
        import numpy as np

        if not isinstance(arr, np.ndarray) or arr.dtype.hasobject:
            raise TypeError(
                "Executor.scatter takes a NumPy array of a non-object dtype "
                f"(it goes into shared memory), not {type(arr).__name__}"
            )
        self._check_open()
        dfut = self._client.scatter(arr, broadcast=broadcast, hash=False)
        return ScatteredArray(dfut, arr.shape, arr.dtype, arr.nbytes)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops taking work.  ``cancel_futures=True`` cancels every call that is not
        running in a fastpool child yet (calls already running finish).  ``wait=True``
        returns once every future is settled.  The plugin and its pools stay on the
        cluster (``client.unregister_worker_plugin(name)`` removes them).  Idempotent
        and thread-safe."""
        with self._lock:
            self._closed = True
            outstanding = list(self._outstanding)
        if cancel_futures and outstanding:
            running = self._executing_keys()
            for fut in outstanding:
                if str(fut._dfut.key) not in running:
                    fut.cancel()
        if wait and threading.current_thread() is not self._settler:
            # (from a done-callback, waiting would wait on the thread that settles)
            cf.wait(outstanding)
        self._settled.put(None)  # the settler exits once nothing is outstanding

    def stats(self) -> dict[str, Any]:
        """Counts of this executor, plus each Dask worker's pool ``stats()`` (with the
        plugin's counters under ``"plugin"``) by worker address.  One round trip to
        every worker; raises what ``client.run`` raises.  Thread-safe."""
        with self._lock:
            out: dict[str, Any] = dict(
                self._counts, inflight=len(self._outstanding), closed=self._closed
            )
        out["workers"] = self._client.run(pool_stats, self._name)
        return out

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True)

    # ---- submission ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise errors.PoolClosed("cannot schedule new tasks after the executor was shut down")

    def _submit(
        self,
        body: Callable[..., Any],
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        opts: dict | None,
    ) -> _ClusterFuture:
        self._check_open()
        deps: dict[str, distributed.Future] = {}

        def to_ref(x: Any) -> Any:
            if type(x) is ScatteredArray:
                deps[x.key] = x.future
                return ScatterRef(x.key)
            return x

        call = Call(swap(fn, to_ref), swap(args, to_ref), swap(kwargs, to_ref))
        key = f"{dask.utils.funcname(fn)}-{uuid.uuid4().hex}"
        # Inner annotations win: a caller's dask.annotate(executor=..., retries=...) must
        # not send the task body itself into a pool or let Dask retry what fastpool ran.
        try:
            with dask.annotate(executor="default", retries=0):
                dfut = self._client.submit(
                    body, self._name, call, opts, deps, key=key, pure=False, retries=0
                )
        except TypeError as exc:  # Dask pickles the task here: "Could not serialize ..."
            root = exc.__cause__ or exc
            raise errors.SerializationError(
                f"the call of {dask.utils.funcname(fn)!r}",
                f"{type(root).__name__}: {root}. Nothing was submitted",
            ) from exc
        fut = _ClusterFuture(self, dfut)
        fut._chunk = body is run_chunk
        with self._lock:
            self._outstanding[fut] = time.time()
            self._counts["submitted"] += 1
        self._client.loop.add_callback(self._cascade, dfut, fut)
        return fut

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def _threads(self) -> int:
        return max(1, sum(self._client.nthreads().values()))

    def _map(
        self,
        fn: Callable[..., Any],
        iterables: tuple,
        timeout: float | None,
        chunksize: int | None,
        buffersize: int | None,
        opts: dict | None,
        ordered: bool,
    ) -> Iterator[Any]:
        run = _mapper.MapRun(
            _MapTarget(self, opts),
            fn,
            iterables,
            chunksize=chunksize,
            timeout=timeout,
            buffersize=self._window if buffersize is None else buffersize,
        )

        def count(fut: cf.Future) -> None:
            with self._lock:
                self._counts["chunks"] += 1
                self._counts["map_window_max"] = max(
                    self._counts["map_window_max"], len(run.pending)
                )

        run.on_submit = count
        return _mapper.MapIterator.over(run.start(ordered))

    # ---- settling ------------------------------------------------------------------

    async def _cascade(self, dfut: distributed.Future, fut: _ClusterFuture) -> None:
        """On Dask's event loop: await the task's outcome, hand it to the settler."""
        try:
            # Future._result is what distributed's own ClientExecutor awaits; it gathers
            # a finished task's value from its worker without blocking the loop.
            outcome = await dfut._result(raiseit=False)
            status = dfut.status
        except BaseException as exc:  # noqa: BLE001 - the client lost the cluster, say
            outcome, status = exc, "lost"
        self._settled.put((fut, status, outcome))

    def _settle_loop(self) -> None:
        while True:
            item = self._settled.get()
            if item is None:
                with self._lock:
                    if self._closed and not self._outstanding:
                        return
                continue
            fut, status, outcome = item
            try:
                self._settle(fut, status, outcome)
            except Exception as exc:  # noqa: BLE001 - never lose the settler; the future says why
                with contextlib.suppress(cf.InvalidStateError):
                    fut.set_exception(
                        RuntimeError(
                            f"fastpool.dask could not settle {fut._dfut.key}: "
                            f"{type(exc).__name__}: {exc}"
                        )
                    )
            with self._lock:
                self._outstanding.pop(fut, None)
                last = self._closed and not self._outstanding
            fut._dfut.release()  # the worker may drop the result now
            if last:
                return

    def _settle(self, fut: _ClusterFuture, status: str, outcome: Any) -> None:
        if fut.done():  # cancelled by the caller meanwhile
            return
        if status == "finished":
            kind = "completed"
            if fut._chunk:  # run_chunk's value: (results, run time)
                outcome, fut._run_s = outcome
            settle = lambda: fut.set_result(outcome)  # noqa: E731
        elif status == "cancelled":
            kind = "cancelled"

            def settle() -> None:
                if cf.Future.cancel(fut):
                    fut.set_running_or_notify_cancel()
        else:
            kind = "failed"
            with self._lock:
                submitted_at = self._outstanding.get(fut, 0.0)
            exc = self._translate(fut, status, outcome, submitted_at)
            if fut._partial is not None:  # a map chunk failed part-way: its results, then exc
                failure = ChunkFailure.caught(fut._partial, exc)
                settle = lambda: fut.set_result(failure)  # noqa: E731
            else:
                settle = lambda: fut.set_exception(exc)  # noqa: E731
        with self._lock:
            self._counts[kind] += 1
        try:
            settle()
        except cf.InvalidStateError:  # the caller cancelled it this instant
            pass

    def _translate(
        self, fut: _ClusterFuture, status: str, outcome: Any, submitted_at: float
    ) -> BaseException:
        key = str(fut._dfut.key)
        if status == "lost":
            return outcome
        _typ, exc, tb = outcome
        if isinstance(exc, TaskFailed):
            cause = DaskRemoteTraceback(exc.traceback_text, exc.worker, key)
            fut._partial = exc.partial
            if exc.closing:
                err: BaseException = self._worker_died(
                    exc.worker,
                    key,
                    "its pool was shut down with it, so the call was stopped",
                    submitted_at,
                )
                err.__cause__ = cause
                return err
            err = exc.error
            err.__cause__ = cause
            return err
        if type(exc).__name__ == "KilledWorker":
            last = exc.args[1] if len(exc.args) > 1 else None
            address = getattr(last, "address", last)
            err = self._worker_died(
                address if isinstance(address, str) else None, key, str(exc), submitted_at
            )
            err.__cause__ = exc.with_traceback(tb)
            return err
        return exc.with_traceback(tb)  # a Dask error of its own (bad arguments, ...)

    def _worker_died(
        self, address: str | None, key: str, detail: str, submitted_at: float
    ) -> BaseException:
        """DaskWorkerMemoryError if the nanny logged a memory restart of that worker
        (of any worker, when Dask did not say which) after the call was submitted."""
        try:
            events = self._client.get_events("worker-restart-memory")
        except Exception:  # noqa: BLE001 - no evidence: say what is known
            events = ()
        for when, event in reversed(list(events)):
            # the scheduler's clock stamps events: a second of slack for another host's
            if when < submitted_at - 1.0:
                break
            if address is None or event.get("worker") == address:
                return DaskWorkerMemoryError(event.get("worker"), detail, key, event.get("rss"))
        return DaskWorkerCrashed(address, detail, key)

    def _cancel_remote(self, dfuts: list) -> None:
        client = self._client
        # client.cancel blocks on the event loop; a caller may be on that loop (a done-
        # callback of a Dask future), so the cancel is handed to the loop instead.
        try:
            client.loop.add_callback(lambda: client.cancel(dfuts, asynchronous=True))
        except RuntimeError:  # the client's loop is closed: nothing left to cancel there
            pass

    def _executing_keys(self) -> set[str]:
        def executing(dask_worker: Any) -> list[str]:
            return [
                str(k)
                for k, ts in dask_worker.state.tasks.items()
                if ts.state in ("executing", "long-running")
            ]

        try:
            found = self._client.run(executing, on_error="ignore")
        except Exception:  # noqa: BLE001 - no answer: treat nothing as running
            return set()
        return {k for keys in found.values() if isinstance(keys, list) for k in keys}


class _MapTarget:
    """The executor as the map engine (``_runtime._mapper``) drives it: one Dask
    task per chunk, with these fastpool options.  Thread-safe."""

    def __init__(self, executor: Executor, opts: dict | None) -> None:
        self.executor, self.opts = executor, opts

    def _map_sizing(self) -> _mapper.Sizing:
        self.executor._check_open()
        return _mapper.Sizing(self.executor._threads(), FIRST_CHUNKSIZE, TARGET_CHUNK_S)

    def _submit_chunk(
        self, fn: Callable[..., Any], chunk: Any, star: bool, *, memo: Any = None
    ) -> cf.Future:
        # memo: Dask ships each chunk's arguments itself; it has no shared-memory copies
        return self.executor._submit(run_chunk, fn, (chunk, star), {}, self.opts)

    def _chunk_seconds(self, fut: cf.Future) -> float | None:
        return getattr(fut, "_run_s", None)

    def _wait_any(self, pending: Any, done: Any, timeout: float | None) -> None:
        cf.wait(list(pending), timeout, cf.FIRST_COMPLETED)

    def _cancel_chunk(self, fut: cf.Future) -> None:
        fut.cancel()


class ExecutorOptions:
    """``Executor.options(...)``: the same executor, with fastpool options on each call."""

    def __init__(self, executor: Executor, opts: dict | None) -> None:
        self._executor, self._opts = executor, opts

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        """``Executor.submit`` with these options.  Thread-safe."""
        return self._executor._submit(run_call, fn, args, kwargs, self._opts)

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """``Executor.map`` with these options on every chunk.  Thread-safe."""
        return self._executor._map(
            fn, iterables, timeout, chunksize, buffersize, self._opts, ordered=True
        )

    def imap_unordered(
        self,
        fn: Callable[..., Any],
        iterable: Iterable[Any],
        chunksize: int | None = None,
        *,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """``Executor.imap_unordered`` with these options on every chunk.  Thread-safe."""
        return self._executor._map(
            fn, (iterable,), None, chunksize, buffersize, self._opts, ordered=False
        )
