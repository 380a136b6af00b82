"""The Dask-worker side of ``fastpool.dask``: the plugin that owns each worker's pool,
and the task bodies that hand calls to it.

    client (fastpool.dask.Executor)      Dask worker process                     fastpool children
    -------------------------------      -------------------                     -----------------
    client.submit(run_call, name, Call,  a Dask thread runs run_call:
      opts, deps={key: scattered})         plugin = worker.plugins[name]
                                           ScatterRef -> plugin.shared(key, arr)  (pool.share once
                                                         per worker per key, cached)
                                           pool.options(**opts).submit(fn, ...)  ===> runs fn
                                           .result()  <===========================  result / error
                                         error: raise TaskFailed(error, traceback text, where)

Why a task body that calls the pool, rather than ``dask.annotate(executor=name)``
(which also works: the plugin registers the pool as ``worker.executors[name]``)?
With the annotation, the worker ships Dask's own task runner and the whole task
spec into the child, so every child imports ``distributed`` (and a replacement
child pays that again), dependencies are pickled into each task, and the pool's
``options`` cannot be set per call.  Here the child sees only ``fn`` and its
arguments, a scattered array crosses as a shared-memory descriptor, and a crash
or timeout reaches the client as fastpool's own exception inside ``TaskFailed``.

The Dask worker must run at least as many threads as the pool has children to keep
them busy: one Dask thread waits on each running call.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import traceback
from typing import Any, Callable

from distributed import WorkerPlugin, get_worker
from distributed.worker import thread_state

from fastpool._integrations._dask_child import apply_items
from fastpool._runtime._call import ChunkFailure
from fastpool.pool import Pool

_POOL_ARGS = frozenset(p for p in inspect.signature(Pool).parameters)


class TaskFailed(Exception):
    """What a Dask task body raises when the call it handed to fastpool failed.

    ``error`` is the call's own exception or fastpool's (``WorkerCrashed``,
    ``TaskTimeout``...); ``traceback_text`` is the whole remote story (the child's
    traceback, then the Dask worker's); ``partial`` holds the results a map chunk
    produced before ``error``; ``closing`` says the Dask worker was shutting its pool
    down when the call failed.  ``fastpool.dask.Executor`` unwraps it, so callers
    never see this class."""

    def __init__(
        self,
        error: BaseException,
        traceback_text: str,
        worker: str,
        pid: int,
        closing: bool = False,
        partial: list | None = None,
    ) -> None:
        super().__init__(error, traceback_text, worker, pid, closing, partial)
        self.error, self.traceback_text = error, traceback_text
        self.worker, self.pid, self.closing, self.partial = worker, pid, closing, partial

    def __str__(self) -> str:
        return (
            f"{type(self.error).__name__}: {self.error} (in fastpool on Dask worker "
            f"{self.worker}, pid {self.pid})"
        )

    def __repr__(self) -> str:  # Dask logs it for every failed task: the gist, not the traceback
        return f"TaskFailed({self.error!r})"


class ScatterRef:
    """Stands in a task's arguments for an array scattered with ``Executor.scatter``."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self) -> tuple:
        return (ScatterRef, (self.key,))

    def __repr__(self) -> str:
        return f"ScatterRef({self.key!r})"


_MAX_DEPTH = 4  # how deep swap() looks into lists, tuples, dicts and partials


def swap(obj: Any, replace: Callable[[Any], Any], depth: int = 0) -> Any:
    """``obj`` with every value for which ``replace`` returns something else replaced,
    looking into lists, tuples, dicts and ``functools.partial`` (a few levels deep).

    The client uses it to turn handles into ``ScatterRef``s, the worker to turn those
    into shared arrays; both walk the same shapes, so whatever one finds the other does."""
    new = replace(obj)
    if new is not obj or depth >= _MAX_DEPTH:
        return new
    d = depth + 1
    if type(obj) in (list, tuple):
        items = [swap(x, replace, d) for x in obj]
        return obj if all(a is b for a, b in zip(items, obj)) else type(obj)(items)
    if type(obj) is dict:
        vals = {k: swap(v, replace, d) for k, v in obj.items()}
        return obj if all(vals[k] is v for k, v in obj.items()) else vals
    import functools

    if type(obj) is functools.partial:
        fn, args, kw = (
            swap(obj.func, replace, d),
            swap(obj.args, replace, d),
            swap(obj.keywords, replace, d),
        )
        if fn is obj.func and args is obj.args and kw is obj.keywords:
            return obj
        return functools.partial(fn, *args, **kw)
    return obj


class Call:
    """``fn(*args, **kwargs)`` packed opaquely, so Dask never walks into the arguments
    (it would read a tuple that starts with a callable as a task of its own)."""

    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __reduce__(self) -> tuple:
        return (Call, (self.fn, self.args, self.kwargs))


class FastpoolPlugin(WorkerPlugin):
    """A ``distributed.WorkerPlugin`` that gives each Dask worker a ``fastpool.Pool``.

    ``FastpoolPlugin(name="fastpool", **pool_kwargs)`` takes ``fastpool.Pool``'s
    keyword arguments.  On each worker (restarted ones included, as Dask re-runs
    plugins there) ``setup`` creates the pool and registers it as
    ``worker.executors[name]``, so ``dask.annotate(executor=name)`` also routes plain
    Dask tasks into it; ``teardown`` (worker close, or the plugin removed)
    force-cancels running calls and shuts the pool down.

    Defaults that differ from ``Pool``: ``workers`` is the Dask worker's ``nthreads``
    (its CPU share: one Dask thread waits on each running call), and
    ``blas_threads`` is 1, as Dask's nanny sets for its workers.

    It is idempotent: registering a second plugin under the same name is ignored and
    the first one's settings stay; use another ``name`` for a pool with other
    settings.  The pool starts its worker template with ``subprocess`` (the Dask
    worker runs threads, so it is never forked), which is why it works in Dask's
    daemonic worker processes, where ``multiprocessing`` refuses to start children.
    If the Dask worker is SIGKILLed, the template sees its socket close and kills
    every child; the shared memory is anonymous and goes with the last process.

    Raises ``TypeError`` at construction for an argument ``Pool`` does not take;
    ``setup`` raises what ``Pool()`` raises, which Dask reports to the client that
    registered the plugin.
    """

    idempotent = True

    def __init__(self, name: str = "fastpool", **pool_kwargs: Any) -> None:
        unknown = set(pool_kwargs) - _POOL_ARGS
        if unknown:
            raise TypeError(
                f"FastpoolPlugin got arguments fastpool.Pool does not take: {sorted(unknown)}"
            )
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, not {name!r}")
        self.name = name
        self.pool_kwargs = pool_kwargs
        self.settings = describe_settings(pool_kwargs)
        self._reset()

    def _reset(self) -> None:
        self.pool: Pool | None = None
        self.closing = False
        self.counts = {"calls": 0, "shared": 0, "shared_hits": 0, "shared_released": 0}
        self._worker: Any = None
        self._lock = threading.Lock()
        self._shared: dict[str, Any] = {}
        self._inflight: set = set()
        self._by_key: dict[Any, Any] = {}  # Dask task key -> the pool future running it

    def __getstate__(self) -> dict:
        return {"name": self.name, "pool_kwargs": self.pool_kwargs, "settings": self.settings}

    def __setstate__(self, state: dict) -> None:
        self.name, self.pool_kwargs, self.settings = (
            state["name"],
            state["pool_kwargs"],
            state["settings"],
        )
        self._reset()

    def _pool_kwargs(self, worker: Any) -> dict:
        kw = dict(self.pool_kwargs)
        kw.setdefault("workers", max(1, int(worker.state.nthreads)))
        kw.setdefault("blas_threads", 1)
        return kw

    async def setup(self, worker: Any) -> None:
        if self.pool is not None and not self.closing:
            return
        self._worker = worker
        # Starting the template and the children takes ~100-200 ms: off the worker's
        # event loop, so its heartbeats to the scheduler go on meanwhile.
        self.pool = await asyncio.to_thread(Pool, **self._pool_kwargs(worker))
        self.closing = False
        worker.executors[self.name] = self.pool

    async def teardown(self, worker: Any) -> None:
        pool = self.pool
        if pool is None:
            return
        self.closing = True
        if worker.executors.get(self.name) is pool:
            del worker.executors[self.name]
        await asyncio.to_thread(self._stop, pool)
        self._shared.clear()

    def _stop(self, pool: Pool) -> None:
        pool.shutdown(wait=False, cancel_futures=True)
        # A running call would hold the worker's close for as long as it runs; it is
        # killed instead, and its task fails (the client is told the worker closed).
        for fut in list(self._inflight):
            pool.cancel(fut, force=True)
        pool.shutdown(wait=True)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        # A scattered array the worker no longer holds need not stay in shared memory
        # either: its block goes back to the arena once no child still maps it.
        if finish in ("released", "forgotten") and self._shared.pop(key, None) is not None:
            self.counts["shared_released"] += 1
        if start in ("executing", "long-running") and finish in ("released", "cancelled"):
            self._stop_call(key)  # the client cancelled it (Dask reports "released")

    def _stop_call(self, key: Any) -> None:
        # The client cancelled a call that runs here (Executor futures never say
        # "running", so their cancel() returns True): Dask cannot stop the thread that
        # waits on it, so the child is killed and replaced, and the call never ends.
        fut, pool = self._by_key.get(key), self.pool
        if fut is not None and pool is not None and not fut.done():
            pool.cancel(fut, force=True)

    # ---- called from Dask threads (run_call / run_chunk) --------------------------

    def shared(self, key: str, arr: Any) -> Any:
        """The pool's read-only shared copy of the scattered array ``key``, made once."""
        hit = self._shared.get(key)
        if hit is not None:
            self.counts["shared_hits"] += 1
            return hit
        with self._lock:
            hit = self._shared.get(key)
            if hit is None:
                assert self.pool is not None
                hit = self.pool.share(arr, readonly=True)
                self._shared[key] = hit
                self.counts["shared"] += 1
            else:
                self.counts["shared_hits"] += 1
        return hit

    def resolve(self, call: Call, deps: dict) -> tuple[Callable[..., Any], tuple, dict]:
        if not deps:
            return call.fn, call.args, call.kwargs

        def replace(x: Any) -> Any:
            return self.shared(x.key, deps[x.key]) if type(x) is ScatterRef else x

        return swap(call.fn, replace), swap(call.args, replace), swap(call.kwargs, replace)

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict, opts: dict | None) -> Any:
        """``fn(*args, **kwargs)`` in a child; its result, or ``TaskFailed``."""
        pool = self.pool
        if pool is None:
            raise RuntimeError(f"the fastpool plugin {self.name!r} has no pool on this worker")
        self.counts["calls"] += 1
        try:
            fut = (pool.options(**opts) if opts else pool).submit(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the client as it is
            raise self._failed(exc) from None
        self._inflight.add(fut)
        key = getattr(thread_state, "key", None)
        if key is not None:
            self._by_key[key] = fut
            ts = self._worker.state.tasks.get(key) if self._worker is not None else None
            if ts is not None and ts.state == "cancelled":  # cancelled before it was known here
                self._stop_call(key)
        try:
            return fut.result()
        except BaseException as exc:  # noqa: BLE001
            raise self._failed(exc) from None
        finally:
            self._inflight.discard(fut)
            if key is not None:
                self._by_key.pop(key, None)

    def _failed(self, exc: BaseException, partial: list | None = None) -> TaskFailed:
        # The child's traceback is the __cause__ fastpool attached; Dask pickles
        # exceptions without their chain, so it travels as text.
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return TaskFailed(
            exc, text, getattr(self._worker, "address", "?"), os.getpid(), self.closing, partial
        )


def _plugin(name: str) -> FastpoolPlugin:
    worker = get_worker()
    plugin = worker.plugins.get(name)
    if not isinstance(plugin, FastpoolPlugin):
        raise RuntimeError(
            f"Dask worker {worker.address} has no FastpoolPlugin named {name!r}; register one with "
            f"client.register_plugin(fastpool.dask.FastpoolPlugin({name!r}))"
        )
    return plugin


def run_call(name: str, call: Call, opts: dict | None, deps: dict) -> Any:
    """Dask task body: one call in the worker's fastpool."""
    plugin = _plugin(name)
    return plugin.run(*plugin.resolve(call, deps), opts)


def run_chunk(name: str, call: Call, opts: dict | None, deps: dict) -> tuple[list, float]:
    """Dask task body: one map chunk (``call.args`` = (items, star)) as one fastpool task."""
    plugin = _plugin(name)
    fn, (items, star), _ = plugin.resolve(call, deps)
    out, run_s = plugin.run(apply_items, (fn, items, star), {}, opts)
    if type(out) is ChunkFailure:  # the client yields the results, then raises the error
        results, error = out.unpack()
        raise plugin._failed(error, results) from None
    return out, run_s


def describe_settings(pool_kwargs: dict) -> dict:
    """Pool arguments as comparable text: a function by its name (a lambda that
    crossed to a worker is another object), an array by shape and dtype (``==`` on
    arrays compares elements), anything else by ``repr``."""

    def one(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        if callable(v):
            return f"{getattr(v, '__module__', '?')}.{getattr(v, '__qualname__', type(v).__name__)}"
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return f"array{tuple(v.shape)} {v.dtype}"
        return repr(v)[:200]

    return {k: one(v) for k, v in sorted(pool_kwargs.items())}


def plugin_settings(name: str, dask_worker: Any) -> dict | None:
    """For ``client.run``: the settings of this worker's plugin ``name`` (None: none)."""
    plugin = dask_worker.plugins.get(name)
    return plugin.settings if isinstance(plugin, FastpoolPlugin) else None


def pool_stats(name: str, dask_worker: Any) -> dict:
    """For ``client.run``: this worker's pool stats plus the plugin's counters."""
    plugin = dask_worker.plugins.get(name)
    if not isinstance(plugin, FastpoolPlugin) or plugin.pool is None:
        return {}
    out = plugin.pool.stats()
    out["plugin"] = dict(plugin.counts, shared_live=len(plugin._shared), pid=os.getpid())
    return out
