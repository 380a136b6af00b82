"""``fastpool.joblib``: a joblib backend named ``"fastpool"`` (docs/joblib.md).

    import fastpool.joblib                      # registers the backend
    with joblib.parallel_config(backend="fastpool", n_jobs=4, memory_limit="2GB"):
        Parallel()(delayed(f)(x) for x in xs)   # or scikit-learn's n_jobs=

    Parallel call  -> FastpoolBackend.configure: lease the pool of this configuration
                      (_joblib_pools: one per n_jobs + options, reused across calls)
    each batch     -> submit: large arrays swapped for shared read-only copies (one
                      per array per call), then Pool.submit(_joblib_task.run_batch,
                      functions, calls, ...): the pool's codec ships it as every call
                      (lambdas and closures by value anywhere in it, __main__ classes,
                      array subclasses), nothing here pickles
    done-callback  -> joblib's BatchCompletionCallBack: result, or the task's own
                      exception, WorkerCrashed, TimeoutError (Parallel(timeout=))
    abort          -> only this call's batches are cancelled; the pool goes on
    Parallel ends  -> terminate: the lease ends; the pool stays for the next call

Thread safety: ``register``, ``get_pool`` and ``shutdown`` are thread-safe.  A
backend instance serves one Parallel call at a time, as joblib uses it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import threading
from concurrent.futures import CancelledError, Future
from typing import Any, Callable, Iterator

try:
    import joblib
    from joblib._parallel_backends import (
        AutoBatchingMixin,
        FallbackToBackend,
        ParallelBackendBase,
        SequentialBackend,
    )
    from joblib.parallel import BatchedCalls
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"fastpool.joblib needs joblib ({exc}); install it with pip install 'fastpool[joblib]'"
    ) from None

from fastpool import errors
from fastpool._integrations import _joblib_pools, _joblib_task
from fastpool._runtime import _mapper
from fastpool._runtime._arrays import block_of, exact_subclass
from fastpool._supervision._sizing import usable_cpus
from fastpool.pool import Pool

__all__ = ["BACKEND_NAME", "FastpoolBackend", "register", "get_pool", "shutdown"]

BACKEND_NAME = "fastpool"
_JOBLIB_KEYS = ("max_nbytes", "mmap_mode", "temp_folder", "verbose", "context", "prefer", "require")
_SHARED_MODES = ("r", "r+", "w+")  # mmap_mode values that share one copy per call
_PLAIN = frozenset((int, float, str, bytes, bool, type(None), complex))  # never hold an array
WAIT_SLICE_S = 0.05  # wait_for_end looks again this often (Ctrl-C, a missed wake-up)
BATCH_GROWTH = 8  # auto-batching: how much a batch may grow at once (joblib: 2)


def register() -> None:
    """Registers (again) the ``"fastpool"`` joblib backend.  Idempotent: the same
    factory under the same name.  ``import fastpool.joblib`` already did it.
    Thread-safe (joblib's registry is a dict)."""
    joblib.register_parallel_backend(BACKEND_NAME, FastpoolBackend)


def get_pool(n_jobs: int = -1, **options: Any) -> Pool:
    """The ``fastpool.Pool`` that Parallel calls with this ``n_jobs`` and these pool
    options run on, started now if needed.

    Use it for ``pool.share(X, readonly=True)``: a shared array crosses every later
    call by descriptor, with no copy at all.  It retires with the others
    (``idle_worker_timeout``, ``shutdown()``); an array it made stays valid after.
    Raises TypeError for an unknown option and what ``fastpool.Pool`` raises for a
    bad one.  Thread-safe."""
    idle = options.pop("idle_worker_timeout", _joblib_pools.UNSET)
    _joblib_pools.check_idle_timeout(idle)
    _joblib_pools.check_options(options)
    return _joblib_pools.pool_for(_n_workers(n_jobs), options, idle)


def shutdown(wait: bool = True) -> None:
    """Shuts down every pool the backend holds (queued tasks are cancelled); the next
    Parallel call starts a new one.  Runs by itself at interpreter exit.  Thread-safe."""
    _joblib_pools.shutdown_all(wait)


def _n_workers(n_jobs: int) -> int:
    """joblib's count: -1 is every usable CPU (affinity, cgroup quota), -2 all but one."""
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs == 0:
        raise ValueError(f"n_jobs must be a non-zero int, not {n_jobs!r}")
    return n_jobs if n_jobs > 0 else max(usable_cpus() + 1 + n_jobs, 1)


class _Call:
    """One Parallel call's state: its shared copies of arrays and its unsettled batches."""

    def __init__(
        self,
        pool: Pool,
        driver: Any,
        max_nbytes: int | None,
        mmap_mode: str | None,
        timeout: float | None,
    ) -> None:
        self.pool = pool
        self.driver = driver
        self.submitter: Any = pool if timeout is None else pool.options(timeout=timeout)
        self.timeout = timeout
        self.max_nbytes = max_nbytes
        self.mode = mmap_mode
        self.lock = threading.Lock()
        self.shared: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, its shared copy)
        self.pending: set[Future] = set()
        self.progress = threading.Condition()  # notified after joblib saw each batch settle
        self.batches: dict[Future, tuple] = {}  # future -> (calls, functions): named on a crash
        self.nd: Any = None  # numpy.ndarray, once an argument needed it

    def forget_arrays(self) -> None:
        with self.lock:
            self.shared.clear()

    # ---- arrays ------------------------------------------------------------------

    def prepare(self, args: tuple, kwargs: dict, nd: Any) -> tuple[tuple, dict]:
        """A call's arguments as they should cross: large arrays, also in a list, tuple
        or dict argument, swapped per mmap_mode (see _array); the rest as it is."""
        out = args
        for j, a in enumerate(args):
            if type(a) not in _PLAIN:
                b = self._value(a, nd, 1)
                if b is not a:
                    if out is args:
                        out = list(args)  # type: ignore[assignment]
                    out[j] = b  # type: ignore[index]
        if kwargs:
            kwargs = {
                k: v if type(v) in _PLAIN else self._value(v, nd, 1) for k, v in kwargs.items()
            }
        return tuple(out), kwargs

    def _value(self, value: Any, nd: Any, depth: int) -> Any:
        if isinstance(value, nd):
            return self._array(value)
        if depth and type(value) in (list, tuple):
            items = [self._value(v, nd, depth - 1) for v in value]
            return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
        if depth and type(value) is dict:
            out = {k: self._value(v, nd, depth - 1) for k, v in value.items()}
            return value if all(out[k] is value[k] for k in value) else out
        return value

    def _array(self, arr: Any) -> Any:
        if arr.dtype.hasobject or (type(arr) is not self.nd and not exact_subclass(type(arr))):
            return arr  # a MaskedArray's mask travels with it: pickled, as loky does
        large = self.max_nbytes is not None and arr.nbytes > self.max_nbytes
        in_arena = block_of(arr) is not None
        if large and self.mode in _SHARED_MODES:
            if in_arena:  # already shared memory: a view crosses as a descriptor
                if self.mode == "r" and arr.flags.writeable:
                    arr = arr.view()
                    arr.flags.writeable = False
                return arr
            return self._shared_copy(arr)
        if in_arena and arr.flags.writeable:
            # A descriptor would let the task write into the caller's array; joblib's
            # contract (a pickled copy, or a read-only memmap) never does.
            return arr.copy()
        return arr  # fastpool's own path: one copy into shared memory, private to the task

    def _shared_copy(self, arr: Any) -> Any:
        with self.lock:
            hit = self.shared.get(id(arr))
            if hit is not None and hit[0] is arr:
                return hit[1]
            shared = self.pool.share(arr, readonly=self.mode == "r")
            if type(arr) is not self.nd:  # np.matrix, np.recarray: the same class over it
                shared = shared.view(type(arr))
            self.shared[id(arr)] = (arr, shared)  # the original is held, so its id stays its own
            return shared

    # ---- batches -----------------------------------------------------------------

    def submit(self, func: Callable[[], Any]) -> Future:
        """Submits one batch.  A batch that cannot be submitted (an argument that does
        not pickle, a closed pool) comes back as a failed future, as with loky: joblib
        submits most batches from a done-callback, where a raise would be swallowed and
        the call would wait forever for the batch."""
        try:
            fut, what = self._submit(func)
        except Exception as exc:  # noqa: BLE001 - reported on the batch's future
            fut, what = Future(), (0, [])
            fut.set_running_or_notify_cancel()
            fut.set_exception(exc)
        with self.lock:
            self.pending.add(fut)
            self.batches[fut] = what
        fut.add_done_callback(self._settled)
        self.driver.watch(fut)
        return fut

    def _submit(self, func: Callable[[], Any]) -> tuple[Future, tuple]:
        if isinstance(func, BatchedCalls):
            fns: list[Any] = []
            index: dict[int, int] = {}
            calls = []
            nd = self.nd = _ndarray()
            last, i = None, 0
            for fn, args, kwargs in func.items:
                if fn is not last:  # a batch mostly repeats one function: sent once
                    last, i = fn, index.get(id(fn), -1)
                if i < 0:
                    i = index[id(fn)] = len(fns)
                    fns.append(fn)
                # without NumPy loaded no argument can be an array; scalars hold none
                if nd is not None and (kwargs or not _PLAIN.issuperset(map(type, args))):
                    args, kwargs = self.prepare(args, kwargs, nd)
                calls.append((i, args, kwargs))
            fut = self.submitter.submit(
                _joblib_task.run_batch,
                tuple(fns),
                calls,
                func._backend,
                func._n_jobs,
                FastpoolBackend,
            )
            what: tuple = (len(calls), fns)
        else:
            fut = self.submitter.submit(_joblib_task.run_callable, func)
            what = (1, [func])
        return fut, what

    def _settled(self, fut: Future) -> None:
        # keep a crashed batch's description for its note; drop the rest at once (the
        # entry holds the future, and the future its result)
        crashed = not fut.cancelled() and isinstance(fut.exception(), errors.WorkerCrashed)
        with self.lock:
            self.pending.discard(fut)
            if not crashed:
                self.batches.pop(fut, None)

    def describe(self, fut: Future) -> str:
        """What the batch behind ``fut`` ran, for a crash's note (forgets it)."""
        with self.lock:
            n, funcs = self.batches.pop(fut, (0, []))
        names = ", ".join(getattr(f, "__qualname__", type(f).__name__) for f in funcs)
        return f"the joblib batch that died held {n} call(s) of {names or 'unknown functions'}"

    def progressed(self, _fut: Future) -> None:
        with self.progress:
            self.progress.notify_all()

    def wait_for_end(self, parallel: Any) -> None:
        """Returns once joblib's Parallel has every result or is aborting (its own
        ``_wait_retrieval`` test), or when none of this call's batches is pending while
        the test still fails (then joblib's loop takes over).  Ctrl-C interrupts it."""

        def ended() -> bool:
            done = parallel.n_completed_tasks >= parallel.n_dispatched_tasks
            return bool(parallel._aborting) or (not parallel._iterating and done)

        idle_looks = 0
        with self.progress:
            while not ended():
                if not self.pending:
                    idle_looks += 1
                    if idle_looks > 2:
                        return
                self.progress.wait(WAIT_SLICE_S)

    def abort(self) -> None:
        """Cancels this call's unsettled batches: queued ones never run.  Running ones
        are killed (their workers replaced), except under Parallel(timeout=): there a
        task still running will be stopped by its own run-time limit if it is slow,
        so a fast one may finish and its worker is spared."""
        with self.lock:
            pending, self.pending = list(self.pending), set()
        force = self.timeout is None
        for fut in pending:
            if fut.done():  # settled meanwhile, or a batch that never reached the pool
                continue
            try:
                self.pool.cancel(fut, force=force)
            except errors.FastPoolError:  # the pool is being torn down: nothing left to stop
                pass


def _ndarray() -> Any:
    np = sys.modules.get("numpy")
    return None if np is None else np.ndarray


class FastpoolBackend(AutoBatchingMixin, ParallelBackendBase):
    """A joblib backend that runs batches of ``delayed`` calls on a ``fastpool.Pool``.

    Made by joblib from ``parallel_config(backend="fastpool", **options)``: the
    options are ``fastpool.Pool``'s (``memory_limit``, ``task_timeout``,
    ``blas_threads``, ...) plus ``idle_worker_timeout`` (seconds an unused pool
    lives on; default 300, None: until exit).  Raises TypeError for an unknown
    option.  One instance serves one Parallel call at a time (joblib's usage)."""

    supports_retrieve_callback = True  # also gives timeout and return_as="generator*"
    supports_inner_max_num_threads = True
    supports_sharedmem = False  # require="sharedmem": joblib falls back to threads
    uses_threads = False
    default_n_jobs = 1

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        **options: Any,
    ) -> None:
        self._idle_timeout_s = options.pop("idle_worker_timeout", _joblib_pools.UNSET)
        _joblib_pools.check_idle_timeout(self._idle_timeout_s)
        _joblib_pools.check_options(options)
        super().__init__(
            nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads, **options
        )
        self._lease: Any = None
        self._call: _Call | None = None

    def compute_batch_size(self) -> int:
        """joblib's auto-batching, allowed to grow faster: a batch that ran far under
        MIN_IDEAL_BATCH_DURATION grows up to BATCH_GROWTH times at once instead of 2,
        since a round trip here costs little next to loky's, so tiny tasks reach
        their ideal batch in a few steps instead of many round trips."""
        # joblib's mixin is untyped: read its two counters through the instance dict
        old: int = vars(self)["_effective_batch_size"]
        duration: float = vars(self)["_smoothed_batch_duration"]
        size = super().compute_batch_size()
        if size > old and duration > 0:
            ideal = 2 * _mapper.aimed_size(old, duration, self.MIN_IDEAL_BATCH_DURATION)
            size = self._effective_batch_size = max(size, min(BATCH_GROWTH * old, ideal))
        return size

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """Workers for this n_jobs: -1 counts the CPUs this process may use (affinity and
        cgroup quota).  Inside a fastpool task too: the worker then starts a pool of its
        own (a nested pool), as loky does inside loky.  Raises ValueError for n_jobs=0."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        return _n_workers(n_jobs)

    def configure(
        self,
        n_jobs: int = 1,
        parallel: Any = None,
        prefer: str | None = None,
        require: str | None = None,
        **kwargs: Any,
    ) -> int:
        """Leases the pool for (n_jobs, options) and returns its size.  Falls back to
        joblib's sequential backend for one job."""
        n = self.effective_n_jobs(n_jobs)
        if n == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        joblib_args = {k: kwargs.pop(k, None) for k in _JOBLIB_KEYS}
        _joblib_pools.check_options(kwargs)  # Parallel(**backend_kwargs) may add pool options
        options = {**self.backend_kwargs, **kwargs}
        if self.inner_max_num_threads is not None:
            blas = options.get("blas_threads")
            if blas is not None and blas != self.inner_max_num_threads:
                raise ValueError(
                    f"inner_max_num_threads={self.inner_max_num_threads} and "
                    f"blas_threads={blas} disagree; pass one of them"
                )
            options["blas_threads"] = self.inner_max_num_threads
        self._end_lease()
        self._lease = _joblib_pools.lease(n, options, self._idle_timeout_s)
        self.parallel = parallel
        timeout = getattr(parallel, "timeout", None)
        self._call = _Call(
            self._lease.pool,
            self._lease.driver,
            joblib_args["max_nbytes"],
            joblib_args["mmap_mode"],
            timeout,
        )
        return n

    def submit(
        self, func: Callable[[], Any], callback: Callable[[Future], None] | None = None
    ) -> Future:
        """Runs one batch on the pool; ``callback`` gets its future when it settles.
        Raises what ``Pool.submit`` raises (SerializationError, PoolClosed, ...)."""
        if self._call is None:
            raise RuntimeError(
                "the fastpool backend was not configured: joblib calls configure() before submit()"
            )
        fut = self._call.submit(func)
        if callback is not None:
            fut.add_done_callback(callback)
            fut.add_done_callback(self._call.progressed)  # after joblib's: sees its counts
        return fut

    apply_async = submit  # the name joblib < 1.5 calls

    def retrieve_result_callback(self, future: Future) -> Any:
        """The batch's result list; else the task's own exception, ``WorkerCrashed``
        (naming the signal), or ``multiprocessing.TimeoutError`` (what joblib raises
        itself) for a batch past ``Parallel(timeout=)``."""
        try:
            return future.result()
        except errors.WorkerCrashed as exc:  # and WorkerHung, WorkerMemoryError
            if self._call is not None:
                exc.add_note(self._call.describe(future))  # fastpool names run_batch only
            raise
        except errors.TaskTimeout as exc:
            raise multiprocessing.TimeoutError(
                f"a batch ran past Parallel(timeout={exc.timeout_s:g}) seconds; its worker was "
                "stopped and replaced, the pool goes on"
            ) from exc
        except CancelledError:
            raise RuntimeError("this batch was cancelled: its Parallel call was aborted") from None

    @contextlib.contextmanager
    def retrieval_context(self) -> Iterator[None]:
        """joblib's main thread collects results by polling, 10 ms asleep between looks,
        so a call that ends just after a look waits out the rest of that sleep.  For a
        call that returns a list (the caller sees nothing before the end anyway) this
        waits for the end first, woken by each batch, so the polling finds it done."""
        parallel = self.parallel
        if (
            self._call is not None
            and parallel is not None
            and not parallel.return_generator
            and parallel.timeout is None
        ):
            self._call.wait_for_end(parallel)
        yield

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Stops this call's batches (see ``_Call.abort``).  The pool, and whatever
        else runs on it, goes on either way, so it is always ready."""
        if self._call is not None:
            self._call.abort()

    def stop_call(self) -> None:
        # `with Parallel(...) as p:` reuses the backend for several calls; an array
        # changed in place between two of them must be copied again.
        if self._call is not None:
            self._call.forget_arrays()

    def terminate(self) -> None:
        """Ends the lease; the pool stays for the next call (see get_pool)."""
        self._end_lease()
        self._call = None
        self.reset_batch_stats()

    def _end_lease(self) -> None:
        if self._lease is not None:
            _joblib_pools.release(self._lease)
            self._lease = None

    def __reduce__(self) -> Any:
        # A nested Parallel may carry this backend into a task: it travels as its
        # options, without the parent's pool.
        options = dict(self.backend_kwargs)
        if self._idle_timeout_s is not _joblib_pools.UNSET:
            options["idle_worker_timeout"] = self._idle_timeout_s
        return (_rebuild, (self.nesting_level, self.inner_max_num_threads, options))


def _rebuild(
    nesting_level: int | None, inner: int | None, options: dict[str, Any]
) -> FastpoolBackend:
    return FastpoolBackend(nesting_level=nesting_level, inner_max_num_threads=inner, **options)


register()
