# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A task, its function and its future: what the dispatcher moves and settles.

    Task   one call or map chunk, its attempts, timings and pinned blocks (not GC-tracked)
    Fn     a function's pickle and id; which workers already hold it
    PoolFuture  the concurrent.futures.Future the caller gets: result() drives the pool
    Registry    the functions a pool has sent, one Fn per distinct pickle
    Ledger      counters and latency samples: what happened to tasks, and the
                prefetch depth their run times call for
    settle_future()  the state change under the futures' lock, waiters told,
                     done-callbacks run with no lock held (Dispatcher._settle's tail)
"""

cimport cython

from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures import _base
import pickle

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free

from fastpool import errors
from fastpool._runtime import _codec
from fastpool._runtime._call import ChunkFailure, ride, ride_chunk

from fastpool._native._core cimport (
    FP_K_CALL, FP_K_CALLKW, FP_K_CHUNK, FP_K_STARCHUNK, FP_R_ERR, FP_R_OK, FP_R_SKIPPED,
)

cdef object _PENDING = _base.PENDING
cdef object _CANCELLED = _base.CANCELLED
cdef object _CANCELLED_NOTIFIED = _base.CANCELLED_AND_NOTIFIED
cdef object _FINISHED = _base.FINISHED
cdef object _loads = pickle.loads
cdef object _dumps = pickle.dumps
cdef object _TRANSFERRED = _codec.TRANSFERRED
cdef bytes _EMPTY = b""
cdef object _callback_log = _base.LOGGER  # concurrent.futures' own logger and wording

FN_REGISTRY_MAX = 4096  # distinct functions before the registry (and every worker's cache) resets
FN_REGISTRY_BYTES = 64 << 20  # ...or this many bytes of their pickles (closures can hold arrays)
cdef Py_ssize_t _fn_max = FN_REGISTRY_MAX
cdef Py_ssize_t _fn_bytes_max = FN_REGISTRY_BYTES

# Counters: the dispatcher's own events (supervision keeps its own), in C_* order.
# Each name says what it counts: calls (submit) and map chunks apart, and the items of
# the chunks that completed.
COUNTER_NAMES = ("calls_submitted", "calls_completed", "calls_failed", "calls_cancelled",
                 "chunks_submitted", "chunks_completed", "chunks_failed", "chunks_cancelled",
                 "items_completed", "unknown_replies", "bad_results", "retried", "calls_inline")


cdef extern from "Python.h":
    void PyObject_GC_Track(object)
    void PyObject_GC_UnTrack(object)
    int PyObject_GC_IsTracked(object)


cdef inline void _track(object fut) noexcept:
    # Back under the GC's eye: fut now holds something that can lead back to it.
    if not PyObject_GC_IsTracked(fut):
        PyObject_GC_Track(fut)


cdef bint is_done(object fut) except -1:
    s = fut._state
    return s is _FINISHED or s is _CANCELLED_NOTIFIED or s is _CANCELLED


class PoolFuture(Future):
    """A ``concurrent.futures.Future`` whose ``result()`` drives the pool itself.

    The thread that waits polls the result rings and settles what it finds,
    its own future included, instead of sleeping until another thread hands
    the result over.  Every other method is ``Future``'s: it works with
    ``concurrent.futures.wait``, ``as_completed`` and ``asyncio.wrap_future``.
    The futures of one pool share one lock (an RLock), so making one costs no
    ``Condition``.

    A new future is not tracked by the garbage collector: a burst of submits keeps
    thousands alive, and each young collection would walk them all.  What it holds
    then cannot lead back to it (its shared lock, its task, whose link back is cut
    when it settles, the dispatcher).  It is tracked again once it holds what can: a
    waiter or done-callback list, an exception (its traceback's frames may hold the
    future), or a result the collector tracks (a container: it may hold anything).
    """

    __slots__ = ("_condition", "_state", "_result", "_exception", "_w", "_cb", "_task", "_disp")

    # The two lists every Future carries are made on first use: most futures never
    # get a waiter or a callback, and each list is one more object for the GC.
    @property
    def _waiters(self):
        w = self._w
        if w is None:
            _track(self)
            w = self._w = []
        return w

    @property
    def _done_callbacks(self):
        cb = self._cb
        if cb is None:
            _track(self)
            cb = self._cb = []
        return cb

    def __init__(self):
        raise TypeError("PoolFuture is made by its pool; submit() returns one")

    def set_exception(self, exception):
        """``Future.set_exception``: for executors, not for callers of ``submit``."""
        _track(self)
        Future.set_exception(self, exception)

    def set_result(self, result):
        """``Future.set_result``: for executors, not for callers of ``submit``."""
        _track(self)  # a result set here, unlike one unpickled, may lead back to it
        Future.set_result(self, result)

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
    PyObject_GC_UnTrack(fut)  # see PoolFuture
    return fut


cdef class Fn:
    def __dealloc__(self):
        free(self.known)

    def __repr__(self):
        return f"<Fn {self.id} {self.name} ({len(self.data)} bytes)>"


cdef class Registry:
    def __cinit__(self, int nslots):
        self._nslots = nslots
        self._by_obj = {}
        self._by_data = {}
        self._riders = {}
        self._next = 1
        self.ride_bytes = 1 << 62

    cdef Fn get(self, object fn, bint chunk, bint *reset):
        """fn's entry, made on first sight (raises SerializationError).  *reset is set
        when the registry was full and started afresh: every worker must forget its
        functions with the next record it gets, and no worker holds any now.

        A function that holds arrays crossing through shared memory, or whose pickle
        is ride_bytes or more, rides in each call (Fn.rides): its entry is that of
        ``_call.ride`` (``ride_chunk`` for a map ``chunk``), under fn's name, and the
        caller puts fn in the call's arguments."""
        cdef Fn f = self._by_obj.get(fn)
        if f is not None:
            return f
        data = _codec.function_bytes(fn, self.ride_bytes)
        name = getattr(fn, "__qualname__", None) or repr(fn)
        if data is None:
            key = (name, chunk)
            f = self._riders.get(key)
            if f is None:
                f = self._entry(_codec.function_bytes(ride_chunk if chunk else ride), name, reset)
                f.rides = True
                self._riders[key] = f
            return f
        f = self._by_data.get(data)
        if f is None:
            f = self._entry(data, name, reset)
            self._by_data[data] = f
        if _codec.stable_function(fn):
            self._by_obj[fn] = f
        return f

    cdef Fn _entry(self, bytes data, str name, bint *reset):
        if (len(self._by_data) + len(self._riders) >= _fn_max
                or self._bytes + len(data) > _fn_bytes_max):
            self._by_obj.clear()
            self._by_data.clear()
            self._riders.clear()
            self._bytes = 0
            reset[0] = True
        cdef Fn f = Fn.__new__(Fn)
        f.id = self._next
        self._next += 1
        f.data = data
        f.name = name
        f.known = <uint32_t *>calloc(self._nslots, sizeof(uint32_t))
        if f.known == NULL:
            raise MemoryError()
        self._bytes += len(data)
        return f


cdef class Ledger:
    def __cinit__(self):
        self._counts = <long long *>calloc(COUNTER_COUNT, sizeof(long long))
        self._waits = <int64_t *>calloc(SAMPLES, sizeof(int64_t))
        self._runs = <int64_t *>calloc(SAMPLES, sizeof(int64_t))
        if self._counts == NULL or self._waits == NULL or self._runs == NULL:
            raise MemoryError()
        self._ewma_run_ns = 1e6
        self._prefetch = 1

    def __dealloc__(self):
        free(self._counts)
        free(self._waits)
        free(self._runs)

    # Plain C increments with the GIL held: no other thread runs between the read and
    # the write, so callers need no lock (and settle holds none).
    cdef void add(self, int counter, long long n) noexcept:
        self._counts[counter] += n

    cdef int ended(self, Task task, int outcome, object value) except -1:
        """Counts one task's end (outcome: END_DONE, END_FAILED or END_CANCELLED).  A
        chunk that returned a ChunkFailure failed after the items before it."""
        if not task.items:
            self._counts[C_COMPLETED if outcome == END_DONE else
                         C_CANCELLED if outcome == END_CANCELLED else C_FAILED] += 1
        elif outcome == END_DONE and type(value) is not ChunkFailure:
            self._counts[C_CHUNKS_COMPLETED] += 1
            self._counts[C_ITEMS] += task.items
        elif outcome == END_DONE:
            self._counts[C_CHUNKS_FAILED] += 1
            self._counts[C_ITEMS] += len((<object>value).results)
        else:
            self._counts[C_CHUNKS_CANCELLED if outcome == END_CANCELLED else C_CHUNKS_FAILED] += 1
        return 0

    cdef void sample(self, int64_t wait_ns, int64_t run_ns) noexcept:
        cdef uint64_t i = self._n % SAMPLES
        self._runs[i] = run_ns
        self._waits[i] = wait_ns
        self._n += 1
        self._ewma_run_ns += 0.2 * (run_ns - self._ewma_run_ns)
        if self._ewma_run_ns > 1e6:
            self._prefetch = 1
        else:
            self._prefetch = <int>min(MAX_PREFETCH,
                                      max(2.0, 2e6 / max(self._ewma_run_ns, 1.0)))

    cdef int prefetch(self) noexcept:
        """How many tasks a worker may hold: 1 while tasks run over 1 ms, else
        enough to cover about 2 ms of work (up to MAX_PREFETCH)."""
        return self._prefetch

    def counts(self):
        return {name: self._counts[i] for i, name in enumerate(COUNTER_NAMES)}

    def samples(self):
        """(queue waits, run times) in ns, the latest up to 8192 of each."""
        cdef uint64_t n = min(self._n, <uint64_t>SAMPLES)
        return ([self._waits[i] for i in range(n)], [self._runs[i] for i in range(n)])


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
        return self.fn.name if self.fn is not None else "<inline>"

    def describe_args(self):
        """What the arguments were, for a crash record: types, array shapes and sizes,
        taken at submit.  Never decoded from the payload: a dead task's bytes may be
        what killed its worker, and must not run in the parent."""
        if self.arg_facts is None:
            return f"plain values ({len(self.args)} B pickled)" if self.args else ""
        return ", ".join([_fact_text(f) for f in self.arg_facts])

    def decode_call(self):
        """(fn, args, kwargs) rebuilt from what was sent: the inline fallback only."""
        fn = _codec.loads(self.fn.data)
        if self.kind == FP_K_CALL:
            return fn, (_loads(self.args) if self.args else ()), {}
        if self.kind == FP_K_CALLKW:
            args, kwargs = _loads(self.args)
            return fn, args, kwargs
        return fn, (_loads(self.args), self.kind == FP_K_STARCHUNK), {}

    def __repr__(self):
        return f"<Task {self.id}.{self.attempt} {self.fn_name} slot {self.slot}>"


cdef int settle_future(object fut, object flock, object fcond, object value, object exc,
                      bint cancelled, list later) except -1:
    """The future's state change under the futures' lock, waiters told, then its
    done-callbacks with no lock held: now, or, with a later list, once the caller
    has settled the whole batch (run_callbacks(later)), so that a callback that
    waits on another future of the batch finds it settled.  Only
    Dispatcher._settle calls it."""
    cdef bint callbacks = True
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
            _track(fut)
            fut._exception = exc
            fut._state = _FINISHED
            if waiters:
                for w in waiters:
                    w.add_exception(fut)
        else:
            if PyObject_GC_IsTracked(value):  # a container: whatever it holds, it may lead back
                _track(fut)
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
        if later is None:
            run_callbacks([fut])
        else:
            later.append(fut)
    return 0


cdef int run_callbacks(list futs) except -1:
    """The done-callbacks of settled futures.  One that raises, whatever it raises,
    is logged as concurrent.futures logs it and the next one runs: user code never
    ends the thread that settles."""
    for fut in futs:
        for callback in fut._cb:
            try:
                callback(fut)
            except BaseException:  # noqa: BLE001 - Future._invoke_callbacks stops at Exception
                _callback_log.exception("exception calling callback for %r", fut)
    return 0


# ---- a task's codec: the call as it goes out, the reply as it comes back -------------

cdef inline bint _atomic(object x):
    t = type(x)
    return (t is int or t is float or t is str or t is bytes or t is bool or x is None
            or t is complex)


cdef tuple _fact(object a, object key):
    # Kept raw (objects and numbers, no text) so that submit pays only for a few
    # getattr calls; _fact_text formats it if a crash record ever needs it.
    shape = getattr(a, "shape", None)
    if shape is not None and hasattr(a, "dtype"):
        return (key, "ndarray", shape, a.dtype, getattr(a, "nbytes", 0))
    if isinstance(a, (list, tuple, dict, set)):
        return (key, type(a), len(a))
    return (key, type(a))


cdef object _fact_text(tuple f):
    key = f[0]
    prefix = "" if key is None else f"{key}="
    if f[1] == "ndarray":
        return f"{prefix}ndarray{tuple(f[2])} {f[3]} {f[4]} B"
    if len(f) == 3:
        return f"{prefix}{f[1].__name__}[{f[2]}]"
    return f"{prefix}{f[1].__name__}"


cdef int encode_call(Task task, tuple args, dict kwargs, object arena, object memo=None) except -1:
    """task.kind and task.args for fn(*args, **kwargs): plain values pickled here,
    anything else through the codec (arrays as descriptors, pinned in task.keep;
    ``memo`` as encode_chunk's)."""
    cdef bint simple = True
    for a in args:
        if not _atomic(a):
            simple = False
            break
    if simple and kwargs:
        for v in kwargs.values():
            if not _atomic(v):
                simple = False
                break
    if simple:
        if kwargs:
            task.kind, task.args = FP_K_CALLKW, _dumps((args, kwargs), 5)
        elif args:
            task.kind, task.args = FP_K_CALL, _dumps(args, 5)
        else:
            task.kind, task.args = FP_K_CALL, _EMPTY
        return 0
    keep = []
    if kwargs:
        task.kind = FP_K_CALLKW
        task.args = _codec.encode_args((args, kwargs), args, kwargs, arena, keep, memo)
    else:
        task.kind, task.args = FP_K_CALL, _codec.encode_args(args, args, kwargs, arena, keep, memo)
    if memo:
        keep.append(memo)
    if keep:
        task.keep = keep
        task.transferred = _TRANSFERRED in keep
    task.arg_facts = ([_fact(a, None) for a in args[:8]]
                      + [_fact(v, k) for k, v in list(kwargs.items())[:8]])
    return 0


cdef int encode_chunk(Task task, object items, bint star, object arena, object memo) except -1:
    """A map chunk: fn(item) (or fn(*item)) for each of items.  ``memo``: the copies
    of arrays into shared memory that the map's chunks share (_arrays.CopyMemo),
    held by every chunk that used one of them."""
    task.kind = FP_K_STARCHUNK if star else FP_K_CHUNK
    keep = []
    task.args = _codec.encode_args(items, (items,), {}, arena, keep, memo)
    if memo:
        keep.append(memo)
    if keep:
        task.keep = keep
        task.transferred = _TRANSFERRED in keep
    task.arg_facts = ((None, list, len(items)),)
    return 0


cdef tuple decode_reply(Task task, object arena):
    """(outcome, value, exc) of a worker's reply (task.rkind, task.payload).  Raises
    what unpickling the result raises: the caller (Dispatcher._settle) catches it.
    A failure to decode an error is that error's SerializationError."""
    cdef uint32_t kind = task.rkind
    payload = task.payload
    task.payload = None
    if kind == FP_R_SKIPPED or task.cancel_requested:
        if kind == FP_R_OK and payload is not None:
            drop_result(payload, arena, task.handoff_src)
        return END_CANCELLED, None, None
    if kind == FP_R_OK:
        if payload is None:
            return END_DONE, None, None
        if task.handoff_src:
            return END_DONE, _codec.decode_result(payload, arena, task.handoff_src), None
        return END_DONE, _loads(payload), None
    if kind == FP_R_ERR and payload is None:  # a skip nobody asked for (Dispatcher._read_slot)
        return END_FAILED, None, errors.SegmentCorrupt(
            f"task {task.id} was dropped by a worker that damaged its slot's shared words; "
            "the worker was killed and replaced")
    what = "error" if kind == FP_R_ERR else "result"
    try:
        if kind == FP_R_ERR:
            exc = _codec.decode_exception(payload)
        else:  # FP_R_BAD_RESULT: the worker could not pickle the result
            exc = _codec.decode_bad_result(payload)
    except Exception as err:  # noqa: BLE001 - a payload the worker could have scribbled
        exc = errors.SerializationError(f"the {what} of task {task.id}", f"undecodable: {err!r}")
    return END_FAILED, None, exc


cdef int drop_result(bytes payload, object arena, int src) except -1:
    """Decodes a result nobody will read, and drops it: decoding is what returns
    the worker's handoff references on the shared blocks it names (else they
    stay pinned); a payload that cannot be decoded gives them back too."""
    try:
        if src:
            _codec.decode_result(payload, arena, src)
        else:
            _loads(payload)
    except BaseException:  # noqa: BLE001 - nothing to tell anyone about a result nobody wants
        pass
    return 0
