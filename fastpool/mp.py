"""``fastpool.mp.Pool``: the ``multiprocessing.Pool`` API with a ``fastpool.Pool`` underneath.

Scripts written against ``multiprocessing.Pool`` run unchanged after one import
line (docs/multiprocessing.md).  This is an adapter over
``fastpool.Pool``'s public API: ``submit`` carries ``apply_async`` and ``imap``
with ``chunksize=1``, ``Pool.map`` / ``imap_unordered`` (fastpool's one map
engine: chunking, window, partial failure) carry every other map.

Data flow, as in ``multiprocessing.pool``:

    map / starmap            the caller's thread drains ``fastpool.Pool.map``
    map_async / imap ... ->  task thread: runs one job at a time, in call order,
                             draining fastpool's lazy map (or submitting items)
    apply_async          ->  fastpool.Pool.submit at once
    a settled future     ->  the result is settled where it settles, unless it has
                             callbacks: then the result thread runs them (one at a
                             time, as multiprocessing's result handler does) and
                             only then marks the result ready
    close                ->  the task thread finishes the queued jobs, shuts the
                             fastpool pool down (every accepted task settles), stops
                             the result thread; ``join`` waits for both threads
    terminate            ->  unsettled results fail at once with BrokenPool; the
                             fastpool pool stops now (running tasks are killed)

The threads hold the pool's ``_State``, never the ``Pool`` object, so a pool
dropped without ``close`` is collected and closes itself.
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing.pool as _mp_pool
import queue
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import CancelledError, Future
from multiprocessing import TimeoutError
from types import MappingProxyType, TracebackType
from typing import Any, Generic, NoReturn, Self, TypeVar

from fastpool import errors
from fastpool._runtime._codec import RemoteTraceback as _FastpoolTraceback

__all__ = [
    "ApplyResult",
    "AsyncResult",
    "IMapIterator",
    "IMapUnorderedIterator",
    "MapResult",
    "MaybeEncodingError",
    "Pool",
]

log = logging.getLogger("fastpool")

R = TypeVar("R")

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"  # multiprocessing.pool's state names
_STOP = object()  # ends a handler thread's queue
_job_ids = itertools.count()
_NO_KWDS: Mapping[str, Any] = MappingProxyType({})


class _State:
    """What the adapter's threads share: the fastpool pool, the state word, the
    unsettled results (``cache``, as multiprocessing names it) and the queues."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.state = RUN
        self.lock = threading.Lock()
        self.cache: dict[int, Any] = {}
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.callbacks: queue.SimpleQueue[Any] = queue.SimpleQueue()


# ---- errors: the ones multiprocessing raises --------------------------------------------


class MaybeEncodingError(errors.SerializationError, _mp_pool.MaybeEncodingError):
    """A task's result (or its exception) that could not come back to the parent: both
    ``fastpool.SerializationError`` and ``multiprocessing.pool.MaybeEncodingError``, so
    code written for either catches it.  ``exc`` and ``value`` are strings, as
    multiprocessing has them: why it could not come back, and what it was."""

    def __init__(self, what: str, reason: str) -> None:
        errors.SerializationError.__init__(self, what, reason)
        self.exc, self.value = reason, what
        self.args = (what, reason)  # pickles as fastpool's errors do: cls(*args)

    __str__ = errors.SerializationError.__str__

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self}>"


# What the core's SerializationError names when the way back failed, not the way out.
_WAY_BACK = ("the result of", "the error of")


def _as_multiprocessing(exc: BaseException) -> BaseException:
    """``exc`` as multiprocessing would raise it: a result that could not come back is
    a MaybeEncodingError, an argument whose pickling raised is that exception itself
    (with fastpool's explanation as a note), and a task's exception has
    ``multiprocessing.pool.RemoteTraceback`` as its ``__cause__`` (fastpool's carries
    the same traceback text).  Anything else is returned as it is.

    A SerializationError that a task raised (a nested pool's, say) is that task's
    exception: its cause is the worker's traceback, never a pickling error of this
    process, and it is raised as it is, as multiprocessing raises a task's exception."""
    if isinstance(exc, errors.SerializationError) and not isinstance(exc, MaybeEncodingError):
        if exc.what.startswith(_WAY_BACK):
            back = MaybeEncodingError(exc.what, exc.reason)
            back.__cause__ = exc.__cause__
            exc = back
        else:
            cause = exc.__cause__
            if (
                isinstance(cause, Exception)
                and not isinstance(cause, errors.FastPoolError)
                and type(cause) is not _FastpoolTraceback
            ):
                cause.add_note(str(exc))
                return cause
    tb = exc.__cause__
    if type(tb) is _FastpoolTraceback:
        exc.__cause__ = _mp_pool.RemoteTraceback(f'\n"""\n{tb.tb}"""')
    return exc


def _raise_as_multiprocessing(exc: BaseException) -> NoReturn:
    """Raises ``_as_multiprocessing(exc)``; from an ``except`` block that caught ``exc``."""
    mp_exc = _as_multiprocessing(exc)
    if mp_exc is not exc:
        mp_exc.__suppress_context__ = True  # the SerializationError it replaces says no more
    raise mp_exc


# ---- results -------------------------------------------------------------------------


class ApplyResult(Generic[R]):
    """What ``apply_async`` returns (``multiprocessing.pool.AsyncResult``).

    Every method is thread-safe."""

    def __init__(
        self,
        st: _State,
        callback: Callable[[R], object] | None,
        error_callback: Callable[[BaseException], object] | None,
    ) -> None:
        self._st = st
        self._event = threading.Event()
        self._job = next(_job_ids)
        self._callback = callback
        self._error_callback = error_callback
        self._success = False
        self._value: Any = None
        st.cache[self._job] = self

    def ready(self) -> bool:
        """True once the call has completed (its callback, if any, has run)."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call completed without raising; ValueError if not ready yet."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        """Waits until the result is ready or ``timeout`` seconds pass."""
        self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> R:
        """The result; raises the call's exception (its type kept, the worker's
        traceback as ``__cause__``: a ``multiprocessing.pool.RemoteTraceback``),
        ``MaybeEncodingError`` if the result could not be pickled back, the exception
        that pickling an argument raised, ``fastpool.WorkerCrashed`` if its worker died,
        ``BrokenPool`` if the pool was terminated first, and
        ``multiprocessing.TimeoutError`` if not ready within ``timeout``."""
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError
        if self._success:
            return self._value  # type: ignore[no-any-return]
        raise self._value

    def _deliver(self, success: bool, value: Any) -> None:
        """Settles now, or through the result thread when there are callbacks to run."""
        if self._callback is None and self._error_callback is None:
            self._set(success, value)
        else:
            self._st.callbacks.put((self, success, value))

    def _set(self, success: bool, value: Any, run_callbacks: bool = True) -> None:
        if self._st.cache.pop(self._job, None) is None:
            return  # settled already: terminate() came first
        self._success, self._value = success, value
        cb = self._callback if success else self._error_callback
        if cb is not None and run_callbacks:
            try:
                cb(value)
            except Exception:
                log.exception(
                    "fastpool.mp: a %s raised", "callback" if success else "error_callback"
                )
        self._event.set()

    def _future_done(self, fut: Future[Any]) -> None:
        self._deliver(*_outcome(fut))


AsyncResult = ApplyResult


class MapResult(ApplyResult[list[Any]]):
    """What ``map_async`` and ``starmap_async`` return: ``get()`` is the list of
    results in input order, or raises the first failure (in input order)."""


def _outcome(fut: Future[Any]) -> tuple[bool, Any]:
    try:
        return True, fut.result()
    except BaseException as exc:  # noqa: BLE001 - the task's failure, reported on its result
        return False, _as_multiprocessing(exc)


class IMapIterator(Generic[R]):
    """What ``imap`` returns: results in input order; ``next(timeout)`` raises
    ``multiprocessing.TimeoutError`` when the next one is not ready in time.

    A failed item raises its exception at its position.  With ``chunksize=1`` the
    items after it still follow, as in multiprocessing; with a larger chunksize the
    iteration ends there (multiprocessing's does too).  Safe to fill from any
    thread; consumed by one."""

    def __init__(self, st: _State) -> None:
        self._st = st
        self._cond = threading.Condition(threading.Lock())
        self._job = next(_job_ids)
        self._items: deque[tuple[bool, Any]] = deque()
        self._index = 0
        self._length: int | None = None
        self._unsorted: dict[int, tuple[bool, Any]] = {}
        self._sealed = False  # terminate() ended it: what the job still sends is dropped
        st.cache[self._job] = self

    def __iter__(self) -> IMapIterator[R]:
        return self

    def next(self, timeout: float | None = None) -> R:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._index == self._length, timeout):
                raise TimeoutError
            if not self._items:
                raise StopIteration
            success, value = self._items.popleft()
        if success:
            return value  # type: ignore[no-any-return]
        raise value

    __next__ = next

    def _set(self, i: int, obj: tuple[bool, Any]) -> None:
        with self._cond:
            if self._sealed:
                return
            if self._index == i:
                self._items.append(obj)
                self._index += 1
                while self._index in self._unsorted:
                    self._items.append(self._unsorted.pop(self._index))
                    self._index += 1
                self._cond.notify()
            else:
                self._unsorted[i] = obj
            self._finish_if_done()

    def _set_length(self, length: int) -> None:
        with self._cond:
            if self._sealed:
                return
            self._length = length
            self._cond.notify()
            self._finish_if_done()

    def _finish_if_done(self) -> None:
        if self._index == self._length:
            self._st.cache.pop(self._job, None)

    def _fail(self, exc: BaseException) -> None:
        """terminate(): the items not yet in fail once, then the iteration ends; what
        the job still sends (it may be reading its input) is dropped."""
        with self._cond:
            if self._length is None or self._index < self._length:
                self._items.append((False, exc))
                self._index += 1
                self._length = self._index
                self._unsorted.clear()
                self._cond.notify()
            self._sealed = True
            self._st.cache.pop(self._job, None)


class IMapUnorderedIterator(IMapIterator[R]):
    """What ``imap_unordered`` returns: results in the order they complete."""

    def _set(self, i: int, obj: tuple[bool, Any]) -> None:
        with self._cond:
            if self._sealed:
                return
            self._items.append(obj)
            self._index += 1
            self._cond.notify()
            self._finish_if_done()


# ---- jobs: run on the task thread, in call order -------------------------------------


class _Star:
    """``fn(*args)`` for one item: starmap's items may differ in length, so they
    cannot be handed to ``fastpool.Pool.map`` as columns.  It pickles by reference,
    and ``fn`` inside it as the pool's codec sends every function (by value from
    ``__main__``, adopted by the worker's ``__main__`` namespace)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, args: Iterable[Any]) -> Any:
        return self.fn(*args)


def _map_job(
    st: _State,
    result: MapResult,
    fn: Callable[..., Any],
    iterable: Iterable[Any],
    chunksize: int | None,
) -> None:
    try:
        values = list(st.pool.map(fn, iterable, chunksize=chunksize))
    except BaseException as exc:  # noqa: BLE001 - the map's first failure, reported on its result
        result._deliver(False, _as_multiprocessing(exc))
    else:
        result._deliver(True, values)


def _imap_job(
    st: _State,
    it: IMapIterator[Any],
    fn: Callable[..., Any],
    iterable: Iterable[Any],
    chunksize: int,
    ordered: bool,
) -> None:
    i = -1
    try:
        if chunksize == 1:
            # One task per item, as multiprocessing's: a failed item does not end the rest.
            for i, x in enumerate(iterable):
                if st.state == TERMINATE:
                    break
                try:
                    fut = st.pool.submit(fn, x)
                except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable item: its own failure
                    it._set(i, (False, _as_multiprocessing(exc)))
                else:
                    fut.add_done_callback(lambda f, i=i: it._set(i, _outcome(f)))
        else:
            results = (
                st.pool.map(fn, iterable, chunksize=chunksize)
                if ordered
                else st.pool.imap_unordered(fn, iterable, chunksize=chunksize)
            )
            for i, value in enumerate(results):
                it._set(i, (True, value))
    except BaseException as exc:  # noqa: BLE001 - the input or the map failed at position i + 1
        it._set(i + 1, (False, _as_multiprocessing(exc)))
        it._set_length(i + 2)
    else:
        it._set_length(i + 1)


def _run_jobs(st: _State) -> None:
    """The task thread: runs the queued jobs in call order until close() or
    terminate(), then shuts the fastpool pool down and stops the result thread."""
    try:
        while True:
            job = st.jobs.get()
            if job is _STOP:
                break
            if st.state != TERMINATE:  # after terminate its result is settled already
                job()
        st.pool.shutdown(wait=True)  # after close: every accepted task settles first
    finally:
        st.callbacks.put(_STOP)


def _run_callbacks(st: _State) -> None:
    """The result thread: settles results that have callbacks, one at a time."""
    while True:
        item = st.callbacks.get()
        if item is _STOP:
            return
        result, success, value = item
        result._set(success, value)


def _close(st: _State) -> None:
    with st.lock:
        if st.state != RUN:
            return
        st.state = CLOSE
    st.jobs.put(_STOP)


# ---- the pool --------------------------------------------------------------------------


class Pool:
    """``multiprocessing.Pool`` with a ``fastpool.Pool`` underneath (docs/multiprocessing.md).

    ``Pool(processes=None, initializer=None, initargs=(), maxtasksperchild=None)``:
    ``processes`` workers (None: the CPUs this process may use, affinity and
    cgroup quota counted), each running ``initializer(*initargs)`` first, each
    replaced after ``maxtasksperchild`` tasks (a map chunk is one task).
    ``context`` is accepted for compatibility and ignored: fastpool starts its
    workers from its own template process.  ``**options`` go to
    ``fastpool.Pool`` as they are (``task_timeout``, ``memory_limit``, ...).

    Semantics follow ``multiprocessing.pool.Pool``; the differences (a dead
    worker fails its task with ``fastpool.WorkerCrashed`` instead of hanging,
    ``terminate`` fails unfinished results with ``BrokenPool``, a failing
    initializer raises ``InitializerError``) are listed in docs/multiprocessing.md.
    Raises ValueError for ``processes < 1`` or a bad ``maxtasksperchild``,
    TypeError for an initializer that is not callable.  Every method is
    thread-safe; callbacks run one at a time on the pool's result thread and
    should return quickly.
    """

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
        context: Any = None,
        **options: Any,
    ) -> None:
        if processes is not None and (not isinstance(processes, int) or processes < 1):
            raise ValueError("Number of processes must be at least 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (
            not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0
        ):
            raise ValueError("maxtasksperchild must be a positive int or None")
        from fastpool.pool import Pool as _FastPool

        pool = _FastPool(
            processes,
            initializer=initializer,
            initargs=tuple(initargs),
            max_tasks_per_worker=maxtasksperchild,
            **options,
        )
        self._processes = pool.workers
        self._st = st = _State(pool)
        self._task_thread = threading.Thread(
            target=_run_jobs, args=(st,), name="fastpool-mp-tasks", daemon=True
        )
        self._result_thread = threading.Thread(
            target=_run_callbacks, args=(st,), name="fastpool-mp-results", daemon=True
        )
        self._task_thread.start()
        self._result_thread.start()
        # A pool dropped while running closes itself (multiprocessing's warns and leaks).
        weakref.finalize(self, _close, st)

    @property
    def _state(self) -> str:
        return self._st.state

    @_state.setter
    def _state(self, value: str) -> None:
        # multiprocessing's own tests set it (test_resource_warning forces RUN back)
        self._st.state = value

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        # As multiprocessing's: a pool dropped while running is a leak worth a warning
        # (ResourceWarning, silent by default); the finalizer then closes it.
        st = getattr(self, "_st", None)
        if st is not None and st.state == RUN:
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning, source=self)

    @property
    def fastpool(self) -> Any:
        """The ``fastpool.Pool`` underneath: its ``stats()``, ``pids()``, shared arrays."""
        return self._st.pool

    def __repr__(self) -> str:
        return (
            f"<{type(self).__module__}.{type(self).__qualname__} state={self._st.state} "
            f"pool_size={self._processes}>"
        )

    def __reduce__(self) -> Any:
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def _check_running(self) -> None:
        if self._st.state != RUN:
            raise ValueError("Pool not running")

    def _queue(self, job: Callable[[], None]) -> None:
        with self._st.lock:  # with close(): a job is queued before the stop, or refused
            self._check_running()
            self._st.jobs.put(job)

    # ---- calls ---------------------------------------------------------------------

    def apply(
        self, func: Callable[..., R], args: Iterable[Any] = (), kwds: Mapping[str, Any] = _NO_KWDS
    ) -> R:
        """``func(*args, **kwds)`` in a worker; returns its result or raises its
        exception (as ``ApplyResult.get``).  ValueError if the pool is not running."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(
        self,
        func: Callable[..., R],
        args: Iterable[Any] = (),
        kwds: Mapping[str, Any] = _NO_KWDS,
        callback: Callable[[R], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> ApplyResult[R]:
        """Schedules ``func(*args, **kwds)``; returns its ``AsyncResult`` at once.

        ``callback(result)`` or ``error_callback(exception)`` runs on the result
        thread before the result becomes ready.  An argument that cannot be
        pickled fails the result (as in multiprocessing), not this call.  May wait
        while fastpool's queue is full.  ValueError if the pool is not running."""
        self._check_running()
        result: ApplyResult[R] = ApplyResult(self._st, callback, error_callback)
        try:
            fut = self._st.pool.submit(func, *args, **kwds)
        except errors.PoolClosed:
            self._st.cache.pop(result._job, None)
            raise ValueError("Pool not running") from None
        except Exception as exc:  # noqa: BLE001 - reported on the result, as multiprocessing does
            result._deliver(False, _as_multiprocessing(exc))
        else:
            fut.add_done_callback(result._future_done)
        return result

    def map(
        self, func: Callable[[Any], R], iterable: Iterable[Any], chunksize: int | None = None
    ) -> list[R]:
        """``[func(x) for x in iterable]`` run in the workers, as a list in input order.

        Raises the first failure in input order (the chunks not yet started are
        then cancelled), and ``fastpool.BrokenPool`` if another thread terminates
        the pool first.  ``chunksize=None``: fastpool picks it from the length.
        Runs on the calling thread.  ValueError if the pool is not running or
        ``chunksize < 1``."""
        self._check_running()
        _check_chunksize(chunksize)
        try:
            return list(self._st.pool.map(func, iterable, chunksize=chunksize))
        except (errors.PoolClosed, CancelledError, errors.BrokenPool) as exc:
            if self._st.state == TERMINATE:  # terminate() from another thread
                raise _terminated("map") from exc
            if isinstance(exc, errors.PoolClosed):
                raise ValueError("Pool not running") from None
            _raise_as_multiprocessing(exc)
        except BaseException as exc:
            _raise_as_multiprocessing(exc)

    def starmap(
        self,
        func: Callable[..., R],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
    ) -> list[R]:
        """``[func(*args) for args in iterable]``, as ``map``."""
        return self.map(_Star(func), iterable, chunksize)

    def map_async(
        self,
        func: Callable[[Any], R],
        iterable: Iterable[Any],
        chunksize: int | None = None,
        callback: Callable[[list[R]], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> MapResult:
        """``map`` in the background; returns its ``MapResult`` at once.

        An iterable without ``len()`` is read into a list first, as in
        multiprocessing.  ``callback(list)`` or ``error_callback(first failure)``
        runs before the result becomes ready.  ValueError if the pool is not
        running or ``chunksize < 1``."""
        self._check_running()
        _check_chunksize(chunksize)
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        result = MapResult(self._st, callback, error_callback)
        self._queue(functools.partial(_map_job, self._st, result, func, iterable, chunksize))
        return result

    def starmap_async(
        self,
        func: Callable[..., R],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
        callback: Callable[[list[R]], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> MapResult:
        """``starmap`` in the background, as ``map_async``."""
        return self.map_async(_Star(func), iterable, chunksize, callback, error_callback)

    def imap(
        self, func: Callable[[Any], R], iterable: Iterable[Any], chunksize: int = 1
    ) -> IMapIterator[R]:
        """An iterator over ``func(x)`` for each x, in input order, computed in the
        background (results wait in memory until read).  ``chunksize=1``: one
        task per item, and a failed item raises at its position without ending
        the iteration; larger: items travel in chunks through fastpool's map, and
        a failure ends the iteration.  An input that raises part-way: the results
        of the chunks read before it, then its exception (as multiprocessing).
        ValueError if the pool is not running or ``chunksize < 1``."""
        return self._imap(func, iterable, chunksize, IMapIterator(self._st), True)

    def imap_unordered(
        self, func: Callable[[Any], R], iterable: Iterable[Any], chunksize: int = 1
    ) -> IMapIterator[R]:
        """``imap``, yielding results in the order they complete."""
        return self._imap(func, iterable, chunksize, IMapUnorderedIterator(self._st), False)

    def _imap(
        self,
        func: Callable[[Any], R],
        iterable: Iterable[Any],
        chunksize: int,
        it: IMapIterator[R],
        ordered: bool,
    ) -> IMapIterator[R]:
        try:
            self._check_running()
            if chunksize != 1:
                _check_chunksize(chunksize)
            self._queue(
                functools.partial(_imap_job, self._st, it, func, iterable, chunksize, ordered)
            )
        except BaseException:
            self._st.cache.pop(it._job, None)
            raise
        return it

    # ---- life ----------------------------------------------------------------------

    def close(self) -> None:
        """Takes no new work; the queued and running work completes, then the
        workers exit.  Idempotent."""
        _close(self._st)

    def join(self) -> None:
        """Waits until the work accepted before ``close`` (or ``terminate``) has
        completed, its callbacks have run and the workers have exited.
        ValueError("Pool is still running") before ``close`` or ``terminate``."""
        if self._st.state == RUN:
            raise ValueError("Pool is still running")
        for t in (self._task_thread, self._result_thread):
            if t is not threading.current_thread():
                t.join()

    def terminate(self) -> None:
        """Stops now: queued tasks are dropped, running ones killed (SIGKILL: no
        signal a task could catch or print), and every unfinished result fails with
        ``fastpool.BrokenPool`` (no callback runs for it).  An ``imap`` or
        ``imap_unordered`` iterator raises that ``BrokenPool`` once, after the
        results it already had, then ``StopIteration``; a ``map`` running in another
        thread raises ``BrokenPool``.  Returns once the workers are gone, without
        waiting for a job still reading its input (an ``imap`` over a slow
        generator): that job stops at its next item, and ``join`` waits for it.
        Idempotent; thread-safe."""
        st = self._st
        with st.lock:
            was = st.state
            st.state = TERMINATE
        if was != TERMINATE:
            broken = _terminated("task")
            for job in list(st.cache.values()):
                if isinstance(job, IMapIterator):
                    job._fail(broken)
                else:
                    job._set(False, broken, run_callbacks=False)
            # Its own path, not fastpool.Pool's Ctrl-C exit (which SIGINTs running tasks
            # and lets their KeyboardInterrupt settle the futures): nothing queued or
            # held runs, running tasks die at once, and no replacement starts.
            st.pool.kill_workers()
            st.pool.shutdown(wait=True)
            st.jobs.put(_STOP)
            st.callbacks.put(_STOP)
        if self._result_thread is not threading.current_thread():
            self._result_thread.join()

    def __enter__(self) -> Self:
        self._check_running()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """``terminate()``, as multiprocessing's Pool does."""
        self.terminate()


def _terminated(what: str) -> BaseException:
    return errors.BrokenPool(f"the pool was terminated before this {what} finished")


def _check_chunksize(chunksize: int | None) -> None:
    if chunksize is not None and (not isinstance(chunksize, int) or chunksize < 1):
        raise ValueError(f"Chunksize must be 1+, not {chunksize!r}")
