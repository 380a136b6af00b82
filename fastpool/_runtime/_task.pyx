# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A task, its function and its future: what the dispatcher moves and settles.

    Task   one call or map chunk, its attempts, timings and pinned blocks (not GC-tracked)
    Fn     a function's pickle and id; which workers already hold it
    PoolFuture  the concurrent.futures.Future the caller gets: result() drives the pool
    settle_future()  the state change under the futures' lock, waiters told,
                     done-callbacks run with no lock held
"""

cimport cython

from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures import _base
import pickle

from libc.stdlib cimport free

from fastpool._runtime import _codec

from fastpool._native._core cimport FP_K_CALL, FP_K_CALLKW, FP_K_STARCHUNK

cdef object _PENDING = _base.PENDING
cdef object _CANCELLED = _base.CANCELLED
cdef object _CANCELLED_NOTIFIED = _base.CANCELLED_AND_NOTIFIED
cdef object _FINISHED = _base.FINISHED
cdef object _loads = pickle.loads


cdef bint is_done(object fut) except -1:
    s = fut._state
    return s is _FINISHED or s is _CANCELLED_NOTIFIED or s is _CANCELLED


cdef int notify_cancelled(object fut) except -1:
    """CANCELLED -> CANCELLED_AND_NOTIFIED (futures' lock held): wait/as_completed learn it."""
    if fut._state is _CANCELLED:
        fut._state = _CANCELLED_NOTIFIED
        if fut._w:
            for w in fut._w:
                w.add_cancelled(fut)
    return 0


class PoolFuture(Future):
    """A ``concurrent.futures.Future`` whose ``result()`` drives the pool itself.

    The thread that waits polls the result rings and settles what it finds,
    its own future included, instead of sleeping until another thread hands
    the result over.  Every other method is ``Future``'s: it works with
    ``concurrent.futures.wait``, ``as_completed`` and ``asyncio.wrap_future``.
    The futures of one pool share one lock (an RLock), so making one costs no
    ``Condition``.
    """

    __slots__ = ("_condition", "_state", "_result", "_exception", "_w", "_cb", "_task", "_disp")

    # The two lists every Future carries are made on first use: most futures never
    # get a waiter or a callback, and each list is one more object for the GC.
    @property
    def _waiters(self):
        w = self._w
        if w is None:
            w = self._w = []
        return w

    @property
    def _done_callbacks(self):
        cb = self._cb
        if cb is None:
            cb = self._cb = []
        return cb

    def __init__(self):
        raise TypeError("PoolFuture is made by its pool; submit() returns one")

    def done(self):
        """True if the future settled (result, exception or cancelled).  Thread-safe."""
        return is_done(self)

    def result(self, timeout=None):
        """The task's result, driving the pool until it settles or ``timeout`` passes.

        Raises the task's exception, ``CancelledError`` if it was cancelled,
        ``TimeoutError`` if it did not settle in time.  Thread-safe."""
        if not is_done(self):
            self._disp.wait(self, timeout)
        state = self._state
        if state is _FINISHED:
            exc = self._exception
            if exc is None:
                return self._result
            try:
                raise exc
            finally:
                exc = None
        if state is _CANCELLED or state is _CANCELLED_NOTIFIED:
            raise CancelledError()
        raise FuturesTimeout()

    def exception(self, timeout=None):
        """The task's exception (None if it returned), driving the pool like ``result``."""
        if not is_done(self):
            self._disp.wait(self, timeout)
        state = self._state
        if state is _FINISHED:
            return self._exception
        if state is _CANCELLED or state is _CANCELLED_NOTIFIED:
            raise CancelledError()
        raise FuturesTimeout()

    def cancel(self):
        """Cancels a task that no worker holds yet; see ``Pool.cancel`` for the rest.

        Returns False once a worker holds the task (it is RUNNING, as in
        ``ProcessPoolExecutor``).  Thread-safe."""
        if not Future.cancel(self):
            return False
        self._disp.drop_cancelled(self._task)
        return True


cdef object new_future(object disp, object fcond, Task task):
    cdef object fut = PoolFuture.__new__(PoolFuture)
    fut._condition = fcond
    fut._state = _PENDING
    fut._result = None
    fut._exception = None
    fut._w = None
    fut._cb = None
    fut._task = task
    fut._disp = disp
    return fut


cdef class Fn:
    def __dealloc__(self):
        free(self.known)

    def __repr__(self):
        return f"<Fn {self.id} {self.name} ({len(self.data)} bytes)>"


@cython.no_gc
cdef class Task:
    """One call or map chunk on its way through the pool (attempts included).

    Not tracked by the GC (one object fewer per task for every collection to
    walk): the only cycle, future -> task -> future, is broken when it settles."""

    @property
    def wire(self):
        """The id its records carry: the task id and the attempt, so a late reply
        to an earlier attempt never settles a later one."""
        return wire_of(self)

    @property
    def fn_name(self):
        return self.fn.name

    def decode_call(self):
        """(fn, args, kwargs) rebuilt from what was sent (inline fallback, crash records)."""
        fn = _codec.loads(self.fn.data)
        if self.kind == FP_K_CALL:
            return fn, (_loads(self.args) if self.args else ()), {}
        if self.kind == FP_K_CALLKW:
            args, kwargs = _loads(self.args)
            return fn, args, kwargs
        return fn, (_loads(self.args), self.kind == FP_K_STARCHUNK), {}

    def __repr__(self):
        return f"<Task {self.id}.{self.attempt} {self.fn.name} slot {self.slot}>"


cdef int settle_future(Task task, object flock, object fcond, object value, object exc, bint cancelled) except -1:
    """Settles the future: the state under the futures' lock, waiters told,
    then the done-callbacks with no lock held."""
    cdef bint callbacks = True
    if task.settled:
        return 0
    task.settled = True
    task.keep = None  # the call's shared blocks may go now
    fut = task.future
    task.future = None  # Task is not GC-tracked: the future -> task -> future cycle ends here
    flock.acquire()
    try:
        state = fut._state
        if state is _FINISHED or state is _CANCELLED_NOTIFIED:
            return 0
        waiters = fut._w
        if state is _CANCELLED:  # cancelled by its caller, whose cancel() ran the callbacks
            fut._state = _CANCELLED_NOTIFIED
            callbacks = False
            if waiters:
                for w in waiters:
                    w.add_cancelled(fut)
        elif cancelled:
            fut._state = _CANCELLED_NOTIFIED
            if waiters:
                for w in waiters:
                    w.add_cancelled(fut)
        elif exc is not None:
            fut._exception = exc
            fut._state = _FINISHED
            if waiters:
                for w in waiters:
                    w.add_exception(fut)
        else:
            fut._result = value
            fut._state = _FINISHED
            if waiters:
                for w in waiters:
                    w.add_result(fut)
        if fcond._waiters:  # a thread in plain Future.result() on the condition
            fcond.notify_all()
    finally:
        flock.release()
    if callbacks and fut._cb:
        fut._invoke_callbacks()
    return 0
