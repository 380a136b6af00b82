# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The dispatch loop: the path of a task from submit to settle, compiled.

    submit(fn, args) ------------------------------------------------------------+
      fn -> Fn (id, pickle; sent to a worker once)   args -> pickle (or descriptors)
      lock: in-flight map, FIFO queue -> LIFO idle slot (or the least-loaded one
            while tasks are short: prefetch) -> board task ring, gathered in C
                                                                                 |
    board result rings ====> collect() on the thread that waits (or the collector)
      lock: match each reply to the exact attempt its slot holds (task id + attempt),
            unknown replies dropped; capacity back to the slot; queued work
            dispatched  -- all BEFORE any future settles --
      then, unlocked: decode, settle the futures in one pass, run done-callbacks

    supervision (Python, _supervisor) reaches in only through methods:
      slot_spawned / take_slot / drain_slot / requeue / fail / set_accepting ...
    and hears back through hooks (ready, init failed, first reply, retire, corrupt,
    attention) called with no lock held.

Locks, in the only order they are taken: the dispatch lock (a C lock, never held
across a blocking call) then the futures' lock (the RLock every PoolFuture
shares, which concurrent.futures.wait/as_completed take).  The drive lock
(one consumer of the result rings) is taken before either.
"""

cimport cython

import logging
import pickle
import threading
from collections import deque
from concurrent.futures import _base

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (
    NOWAIT_LOCK, WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_get_thread_ident, PyThread_release_lock, PyThread_type_lock,
)

cdef extern from "pythread.h" nogil:
    ctypedef enum PyLockStatus:
        PY_LOCK_FAILURE, PY_LOCK_ACQUIRED, PY_LOCK_INTR
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds, int intr_flag)
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free

from fastpool._runtime import _codec

from fastpool import errors
from fastpool._runtime._call import ChunkFailure
from fastpool._native._core import ring_limit_error

from fastpool._native._core cimport (
    FP_K_CALL, FP_K_CALLKW, FP_K_CHUNK, FP_K_INIT, FP_K_STARCHUNK, FP_R_BAD_RESULT, FP_R_ERR, FP_R_INIT_FAILED,
    FP_AUX_HANDOFFS, FP_R_OK, FP_R_READY, FP_R_SKIPPED, Board, fp_aux_call, fp_now_ns, fp_recv_t,
)
from fastpool._native._sys cimport FP_AGAIN, FP_CORRUPT, FP_OK, FP_TOOBIG
from fastpool._runtime._task cimport Fn, Task, is_done, new_future, notify_cancelled, settle_future, wire_of

log = logging.getLogger("fastpool")

cdef object _PENDING = _base.PENDING
cdef object _RUNNING = _base.RUNNING
cdef object _loads = pickle.loads
cdef object _dumps = pickle.dumps
cdef object _TRANSFERRED = _codec.TRANSFERRED
cdef bytes _EMPTY = b""

DEF MAX_PREFETCH = 16
DEF READ_BUDGET = 256       # records per slot per collect round: one busy worker cannot starve the rest
DEF FN_REGISTRY_MAX = 4096  # distinct functions before the registry (and every worker's cache) resets
DEF FN_REGISTRY_BYTES = 64 << 20  # ...or this many bytes of their pickles (closures can hold arrays)

PARK_SLICE_S = 0.05         # every wait returns this often, so Ctrl-C and deadlines are seen
COLLECTOR_GRACE_S = 0.002   # the collector stays away this long after a caller drove or submitted
cdef double _park_slice = PARK_SLICE_S
cdef int64_t _grace_ns = <int64_t>(COLLECTOR_GRACE_S * 1e9)
cdef double _parent_spin = 80e-6

cdef uint64_t _next_task_id = 1   # unique across pools; bumped with the GIL held and nothing between


def set_parent_spin(double seconds):
    """How long a waiting thread spins on the result rings before it parks."""
    global _parent_spin
    _parent_spin = seconds


# Counters: the dispatcher's own events (supervision keeps its own).
COUNTER_NAMES = ("submitted", "completed", "failed", "cancelled", "chunks", "chunks_completed",
                 "chunks_failed", "chunks_cancelled", "items", "unknown_replies", "bad_results", "retried")


cdef inline bint _atomic(object x):
    t = type(x)
    return t is int or t is float or t is str or t is bytes or t is bool or x is None or t is complex


cdef class Dispatch:
    """The pool's queue, idle stack, in-flight and assignment maps, and the
    submit and completion paths between them (see the module docstring).

    Thread safety: every public method may be called from any thread; the
    collection methods that need the drive lock take it (``drain_slot`` must
    run on the thread that holds it, i.e. from the ``on_attention`` hook)."""

    def __cinit__(self, Board board, int nslots, *args, **kwargs):
        self.board = board
        self.nslots = nslots
        self._lock = PyThread_allocate_lock()
        self._drive = PyThread_allocate_lock()
        self._idle = <int *>calloc(nslots, sizeof(int))
        self._in_idle = <char *>calloc(nslots, 1)
        self._ready = <char *>calloc(nslots, 1)
        self._accepting = <char *>calloc(nslots, 1)
        self._answered = <char *>calloc(nslots, 1)
        self._corrupt = <char *>calloc(nslots, 1)
        self._flush = <char *>calloc(nslots, 1)
        self._gen = <uint32_t *>calloc(nslots, sizeof(uint32_t))
        self._served = <uint64_t *>calloc(nslots, sizeof(uint64_t))
        self._skip_seq = <uint64_t *>calloc(nslots, sizeof(uint64_t))
        self._counts = <long long *>calloc(COUNTER_COUNT, sizeof(long long))
        self._wait_samples = <int64_t *>calloc(SAMPLES, sizeof(int64_t))
        self._run_samples = <int64_t *>calloc(SAMPLES, sizeof(int64_t))
        if (self._lock == NULL or self._drive == NULL or self._idle == NULL or self._in_idle == NULL
                or self._ready == NULL or self._accepting == NULL or self._answered == NULL
                or self._corrupt == NULL or self._flush == NULL or self._gen == NULL or self._served == NULL
                or self._skip_seq == NULL or self._counts == NULL or self._wait_samples == NULL
                or self._run_samples == NULL):
            raise MemoryError()
        for s in range(nslots):
            self._gen[s] = 1  # Fn.known starts at 0: nobody holds a function yet

    def __init__(self, Board board, int nslots, *, Py_ssize_t max_queue, bint reject,
                 queue_timeout, max_tasks, arena, hooks):
        self._queue = deque()
        self._inflight = {}
        self._assigned = [deque() for _ in range(nslots)]
        self.max_queue = max_queue
        self._reject = reject
        self._queue_timeout = -1.0 if queue_timeout is None else queue_timeout
        self._max_tasks = 0 if max_tasks is None else max_tasks
        self.depth = 1
        self._ewma_run_ns = 1e6
        self._fns_by_obj = {}
        self._fns_by_data = {}
        self._next_fn = 1
        self._arena = arena
        self._hooks = hooks
        self._fcond = threading.Condition(threading.RLock())
        self._flock = self._fcond._lock if hasattr(self._fcond, "_lock") else threading.RLock()
        self._progress = threading.Condition(threading.Lock())
        self._pending = []
        self._discard = []

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)
        if self._drive != NULL:
            PyThread_free_lock(self._drive)
        free(self._idle)
        free(self._in_idle)
        free(self._ready)
        free(self._accepting)
        free(self._answered)
        free(self._corrupt)
        free(self._flush)
        free(self._gen)
        free(self._served)
        free(self._skip_seq)
        free(self._counts)
        free(self._wait_samples)
        free(self._run_samples)

    def set_hooks(self, hooks):
        """The supervision object told about ready slots, deaths, damage (see module doc)."""
        self._hooks = hooks

    # ---- locking ---------------------------------------------------------------------

    cdef int _acquire(self) except -1:
        if PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            return 0
        with nogil:  # the holder may need the GIL to finish
            PyThread_acquire_lock(self._lock, WAIT_LOCK)
        return 0

    cdef void _release(self) noexcept:
        PyThread_release_lock(self._lock)

    # ---- submit ----------------------------------------------------------------------

    cdef Fn _fn(self, object fn):
        cdef Fn f = self._fns_by_obj.get(fn)
        if f is not None:
            return f
        data = _codec.function_bytes(fn)  # raises SerializationError
        f = self._fns_by_data.get(data)
        if f is None:
            if len(self._fns_by_data) >= FN_REGISTRY_MAX or self._fn_bytes + len(data) > FN_REGISTRY_BYTES:
                # Every worker forgets its functions with the next record it gets,
                # and the parent forgets what it sent: ids restart from scratch.
                self._fns_by_obj.clear()
                self._fns_by_data.clear()
                self._fn_bytes = 0
                for s in range(self.nslots):
                    self._flush[s] = 1
                    self._gen[s] += 1
            f = Fn.__new__(Fn)
            f.id = self._next_fn
            self._next_fn += 1
            f.data = data
            f.name = getattr(fn, "__qualname__", None) or repr(fn)
            f.known = <uint32_t *>calloc(self.nslots, sizeof(uint32_t))
            if f.known == NULL:
                raise MemoryError()
            self._fns_by_data[data] = f
            self._fn_bytes += len(data)
        if _codec.stable_function(fn):
            self._fns_by_obj[fn] = f
        return f

    def submit(self, fn, tuple args, dict kwargs, options=None, bint wait=True):
        """Queues fn(*args, **kwargs); returns its PoolFuture.  Raises before
        anything is queued: PoolClosed, SerializationError (naming the bad
        argument), QueueFull (at once when wait is False, whatever on_full
        says: asyncio's admission must never block its loop), CircuitOpen."""
        if self._closed:
            raise errors.PoolClosed()
        cdef Fn f = self._fn(fn)
        cdef Task task = Task.__new__(Task)
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
        else:
            keep = []
            if kwargs:
                task.kind, task.args = FP_K_CALLKW, _codec.encode_args((args, kwargs), args, kwargs,
                                                                        self._arena, keep)
            else:
                task.kind, task.args = FP_K_CALL, _codec.encode_args(args, args, kwargs, self._arena, keep)
            if keep:
                task.keep = keep
                task.transferred = _TRANSFERRED in keep
        return self._submit_task(task, f, options, 0, wait)

    def submit_chunk(self, fn, items, bint star, bint wait=True):
        """Queues one map chunk: fn(item) (or fn(*item)) for each item, in a worker."""
        if self._closed:
            raise errors.PoolClosed()
        cdef Fn f = self._fn(fn)
        cdef Task task = Task.__new__(Task)
        task.kind = FP_K_STARCHUNK if star else FP_K_CHUNK
        keep = []
        task.args = _codec.encode_args(items, (items,), {}, self._arena, keep)
        if keep:
            task.keep = keep
            task.transferred = _TRANSFERRED in keep
        return self._submit_task(task, f, None, len(items), wait)

    cdef object _submit_task(self, Task task, Fn f, object options, Py_ssize_t items, bint wait):
        cdef Py_ssize_t size = PyBytes_GET_SIZE(f.data) + PyBytes_GET_SIZE(task.args)
        if <uint64_t>size > self.board.max_record:
            raise ring_limit_error(f"the call of {f.name!r}", size, self.board.max_record,
                                   "pass large arrays through shared memory (pool.share) or raise "
                                   "Pool(ring_bytes=...). Nothing was submitted")
        task.fn = f
        task.options = options
        task.items = items
        task.slot = -1
        task.t_submit = fp_now_ns()
        fut = new_future(self, self._fcond, task)
        task.future = fut
        self._enqueue(task, wait)
        self._last_fg = task.t_submit
        self._collect_if_free()
        return fut

    cdef object _enqueue(self, Task task, bint wait):
        global _next_task_id
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef double deadline = -1.0, left
        cdef Py_ssize_t low
        self._acquire()
        try:
            while True:
                if self._closed:
                    raise errors.PoolClosed()
                if self._circuit_open:
                    exc = self._hooks.circuit_error()
                    if exc is not None:
                        raise exc
                if len(self._queue) < self.max_queue or self._driver == me:
                    break  # a callback on the driving thread never blocks: it would wait on itself
                if self._reject or not wait:
                    raise errors.QueueFull(self.max_queue)
                if deadline < 0 and self._queue_timeout >= 0:
                    deadline = fp_now_ns() * 1e-9 + self._queue_timeout
                if deadline >= 0 and fp_now_ns() * 1e-9 >= deadline:
                    raise errors.QueueFull(self.max_queue, self._queue_timeout)
                self._release()
                try:  # drive completions ourselves: that is what makes room
                    left = _park_slice if deadline < 0 else min(_park_slice, deadline - fp_now_ns() * 1e-9)
                    # drain to a low-water mark, not one slot: one drive per many submits
                    low = self.max_queue - max(1, self.max_queue // 4)
                    self._drive_until(None, low, max(left, 0.0))
                finally:
                    self._acquire()
            task.id = _next_task_id
            _next_task_id += 1
            self._inflight[task.id] = task
            if task.items:
                self._counts[C_CHUNKS] += 1
            else:
                self._counts[C_SUBMITTED] += 1
            self._queue.append(task)
            self._dispatch_locked()
        finally:
            self._release()
        self._run_events()

    cdef int _collect_if_free(self) except -1:
        # The submitting thread settles what is ready while nobody else drives:
        # no thread hand-off, and the collector thread stays asleep.
        if self._driver != 0 or not PyThread_acquire_lock(self._drive, NOWAIT_LOCK):
            return 0
        self._driver = PyThread_get_thread_ident()
        try:
            self.collect()
        except BaseException:
            log.exception("fastpool: collecting results on a submitting thread failed")
        finally:
            self._driver = 0
            PyThread_release_lock(self._drive)
        return 0

    # ---- dispatch (lock held) ------------------------------------------------------

    cdef bint _accepts(self, int s) except -1:
        if not self._ready[s] or not self._accepting[s] or self._corrupt[s]:
            return False
        return self._max_tasks == 0 or self._served[s] + <uint64_t>len(self._assigned[s]) < self._max_tasks

    cdef void _to_idle(self, int s) noexcept:
        if not self._in_idle[s] and self._ready[s] and self._accepting[s] and not self._corrupt[s]:
            self._in_idle[s] = 1
            self._idle[self._nidle] = s
            self._nidle += 1

    cdef int _pick(self) except -2:
        cdef int s, best = -1
        cdef Py_ssize_t k, bestn
        if self._paused:
            return -1  # memory pressure: feeding workers now would feed the OOM killer
        while self._nidle > 0:
            self._nidle -= 1
            s = self._idle[self._nidle]
            self._in_idle[s] = 0
            if self._accepts(s):
                return s
        if self.depth <= 1:
            return -1
        bestn = self.depth
        for s in range(self.nslots):
            if self._accepts(s):
                k = len(self._assigned[s])
                if k < bestn:
                    best, bestn = s, k
        return best

    cdef int _push(self, int s, Task task) noexcept:
        cdef Fn f = task.fn
        cdef bint send_fn = f.known[s] != self._gen[s]
        cdef Py_ssize_t flen = PyBytes_GET_SIZE(f.data) if send_fn else 0
        cdef uint64_t aux = fp_aux_call(f.id, flen, self._flush[s])
        cdef int rc = self.board.push_task(s, task.kind, wire_of(task), aux,
                                           PyBytes_AS_STRING(f.data), flen,
                                           PyBytes_AS_STRING(task.args), PyBytes_GET_SIZE(task.args))
        if rc == FP_OK:
            if send_fn:
                f.known[s] = self._gen[s]
            self._flush[s] = 0
        return rc

    cdef int _dispatch_locked(self) except -1:
        cdef int s, rc
        cdef Task task
        cdef bint flocked = False
        queue = self._queue
        try:
            while queue:
                s = self._pick()
                if s < 0:
                    break
                task = queue.popleft()
                if task.t_dispatch == 0:
                    if not flocked:
                        self._flock.acquire()
                        flocked = True
                    fut = task.future
                    if fut._state is _PENDING:
                        fut._state = _RUNNING
                    else:  # cancelled while queued: tell as_completed/wait now
                        notify_cancelled(fut)
                        self._drop_locked(task)
                        self._to_idle(s)
                        continue
                    task.t_dispatch = fp_now_ns()
                rc = self._push(s, task)
                if rc == FP_OK:
                    task.slot = s
                    self._assigned[s].append(task)
                    continue
                queue.appendleft(task)
                if rc == FP_AGAIN:  # ring full: the slot is busy enough
                    if not self._assigned[s]:
                        self._to_idle(s)
                    break
                # The worker wrote its task ring's head: it can take nothing more.
                self._mark_corrupt(s, "its task ring's head was overwritten")
        finally:
            if flocked:
                self._flock.release()
        return 0

    cdef int _drop_locked(self, Task task) except -1:
        if self._inflight.pop(task.id, None) is not None:
            self._counts[C_CHUNKS_CANCELLED if task.items else C_CANCELLED] += 1
        task.settled = True
        task.keep = None
        task.future = None
        return 0

    cdef int _mark_corrupt(self, int s, str what) except -1:
        if not self._corrupt[s]:
            self._corrupt[s] = 1
            self._ready[s] = 0
            self._pending.append(("corrupt", s, what))

    # ---- completion ------------------------------------------------------------------

    cdef int collect(self) except -1:
        """One round: results from every result ring, then deaths.  Drive lock held.

        Returns how many records and events it handled."""
        cdef int n = 0, s, i, start
        cdef list settle = []
        if self.torn_down or self.board.closed:
            return 0
        self._acquire()
        try:
            start = self._next_poll
            for i in range(self.nslots):
                s = (start + i) % self.nslots
                if not self._corrupt[s] and self.board.results_pending(s):
                    n += self._read_slot(s, settle, self._pending, READ_BUDGET)
            self._next_poll = (start + 1) % self.nslots
            if n and self._queue:
                self._dispatch_locked()  # capacity returns BEFORE any future settles
        finally:
            self._release()
        for task in settle:
            self._settle(<Task>task)
        if self._discard:
            self._acquire()
            dropped, self._discard = self._discard, []
            self._release()
            for payload, src in dropped:
                self._drop_result(payload, src)
        n += self._run_events()
        if self.board.take_attention():
            n += 1
            self._hooks.on_attention()
        if n and self._fg_waiting:
            with self._progress:
                self._progress.notify_all()
        return n

    cdef int _read_slot(self, int s, list settle, list events, Py_ssize_t budget) except -1:
        cdef fp_recv_t rec
        cdef int rc, k = 0
        cdef uint32_t kind
        cdef uint64_t wire
        cdef Task task, t
        cdef Board board = self.board
        q = self._assigned[s]
        while budget < 0 or k < budget:
            rc = board.peek_result(s, &rec)
            if rc == FP_AGAIN:
                break
            if rc != FP_OK:
                self._mark_corrupt(s, "its result ring holds a record that breaks the format "
                                      "(a position or a length out of bounds)")
                break
            kind, wire = rec.kind, rec.task_id
            payload = PyBytes_FromStringAndSize(<const char *>rec.payload, rec.len) if rec.len else None
            board.release_result(s, rec.next)
            k += 1
            if kind == FP_R_READY:
                if not self._ready[s]:
                    self._ready[s] = 1
                    if not q:
                        self._to_idle(s)
                    events.append(("ready", s, rec.aux))
                continue
            if kind == FP_R_INIT_FAILED:
                events.append(("init_failed", s, payload))
                continue
            if kind != FP_R_OK and kind != FP_R_ERR and kind != FP_R_BAD_RESULT and kind != FP_R_SKIPPED:
                self._mark_corrupt(s, f"its result ring holds a record of unknown kind {kind}")
                break
            task = None
            if q:
                t = q[0]
                if wire_of(t) == wire:
                    task = q.popleft()
                else:
                    for t in q:
                        if wire_of(t) == wire:
                            task = t
                            break
                    if task is not None:
                        q.remove(task)
            if task is None:  # not a task this slot holds (late, or never ours): drop it
                self._counts[C_UNKNOWN] += 1
                if kind == FP_R_OK and payload is not None:
                    self._discard.append((payload, s + 1 if rec.aux & FP_AUX_HANDOFFS else 0))
                continue
            if kind == FP_R_SKIPPED and not task.cancel_requested and not task.settled:
                # Nobody asked to drop it: the worker's skip words were overwritten.
                task.rkind, task.payload = FP_R_ERR, None
                self._inflight.pop(task.id, None)
                self._counts[C_CHUNKS_FAILED if task.items else C_FAILED] += 1
                settle.append(task)
                self._mark_corrupt(s, f"it skipped task {task.id}, which nobody cancelled")
                break
            if kind != FP_R_SKIPPED:
                self._served[s] += 1
                if self._max_tasks and self._served[s] >= self._max_tasks:
                    self._accepting[s] = 0
            if not self._answered[s]:
                self._answered[s] = 1
                events.append(("answered", s, 0))
            if not q:
                if self._accepting[s]:
                    self._to_idle(s)
                elif self._ready[s]:
                    events.append(("retire", s, 0))
            if task.settled:  # cancelled while its worker held it: counted then
                if kind == FP_R_OK and payload is not None:
                    self._discard.append((payload, s + 1 if rec.aux & FP_AUX_HANDOFFS else 0))
                continue
            self._inflight.pop(task.id, None)
            task.rkind = kind
            task.payload = payload
            task.run_ns = rec.aux & ~FP_AUX_HANDOFFS
            task.handoff_src = s + 1 if rec.aux & FP_AUX_HANDOFFS else 0
            if kind == FP_R_SKIPPED or task.cancel_requested:
                self._counts[C_CHUNKS_CANCELLED if task.items else C_CANCELLED] += 1
            elif kind == FP_R_OK:
                if task.items:
                    self._counts[C_CHUNKS_COMPLETED] += 1
                    self._counts[C_ITEMS] += task.items
                else:
                    self._counts[C_COMPLETED] += 1
            else:
                if kind == FP_R_BAD_RESULT:
                    self._counts[C_BAD_RESULTS] += 1
                self._counts[C_CHUNKS_FAILED if task.items else C_FAILED] += 1
            if kind != FP_R_SKIPPED:
                self._sample(task, task.run_ns)
            settle.append(task)
        return k

    cdef int _sample(self, Task task, int64_t run_ns) except -1:
        cdef uint64_t i = self._nsamples % SAMPLES
        self._run_samples[i] = run_ns
        self._wait_samples[i] = task.t_dispatch - task.t_submit
        self._nsamples += 1
        self._ewma_run_ns += 0.2 * (run_ns - self._ewma_run_ns)
        if self._ewma_run_ns > 1e6:
            self.depth = 1
        else:
            self.depth = <int>min(MAX_PREFETCH, max(2.0, 2e6 / max(self._ewma_run_ns, 1.0)))
        return 0

    cdef int _settle(self, Task task) except -1:
        cdef uint32_t kind = task.rkind
        payload = task.payload
        task.payload = None
        if kind == FP_R_SKIPPED or task.cancel_requested:
            if kind == FP_R_OK and payload is not None:
                self._drop_result(payload, task.handoff_src)
            return self._finish(task, None, None, True)
        if kind == FP_R_OK:
            if payload is None:
                return self._finish(task, None, None, False)
            try:
                value = _codec.decode_result(payload, self._arena, task.handoff_src) if task.handoff_src \
                    else _loads(payload)
            except Exception as exc:  # noqa: BLE001 - the parent cannot rebuild the result
                self._count_failed_ok(task, 0)
                return self._finish(task, None, errors.SerializationError(
                    f"the result of task {task.id}", f"unpickling failed in the parent: {exc!r}"), False)
            if task.items and type(value) is ChunkFailure:
                self._count_failed_ok(task, len((<object>value).results))
            return self._finish(task, value, None, False)
        if kind == FP_R_ERR:
            if payload is None:  # see _read_slot: a skip nobody asked for
                return self._finish(task, None, errors.SegmentCorrupt(
                    f"task {task.id} was dropped by a worker that damaged its slot's shared words; "
                    "the worker was killed and replaced"), False)
            try:
                exc = _codec.decode_exception(payload)
            except Exception as err:  # noqa: BLE001 - a payload the worker could have scribbled
                exc = errors.SerializationError(f"the error of task {task.id}", f"undecodable: {err!r}")
            return self._finish(task, None, exc, False)
        try:
            exc = _codec.decode_bad_result(payload)
        except Exception as err:  # noqa: BLE001
            exc = errors.SerializationError(f"the result of task {task.id}", f"undecodable: {err!r}")
        self._hooks.on_bad_result(task)
        return self._finish(task, None, exc, False)

    cdef int _count_failed_ok(self, Task task, Py_ssize_t done) except -1:
        # An OK record that was a failure after all: a result the parent could not
        # decode (done = 0), or a map chunk whose function raised (it carries the
        # done items before the failing one, and the exception).
        self._acquire()
        if task.items:
            self._counts[C_CHUNKS_COMPLETED] -= 1
            self._counts[C_CHUNKS_FAILED] += 1
            self._counts[C_ITEMS] -= task.items - done
        else:
            self._counts[C_COMPLETED] -= 1
            self._counts[C_FAILED] += 1
        self._release()
        return 0

    cdef int _drop_result(self, bytes payload, int src) except -1:
        """Decodes a result nobody will read, and drops it: decoding is what returns
        the worker's handoff references on the shared blocks it names (else they
        stay pinned); a payload that cannot be decoded gives them back too."""
        try:
            if src:
                _codec.decode_result(payload, self._arena, src)
            else:
                _loads(payload)
        except Exception:  # noqa: BLE001 - nothing to tell anyone about a result nobody wants
            pass
        return 0

    cdef int _finish(self, Task task, object value, object exc, bint cancelled) except -1:
        return settle_future(task, self._flock, self._fcond, value, exc, cancelled)

    cdef int _run_events(self) except -1:
        """Hooks for what the last locked section saw, called with no lock held."""
        if not self._pending:
            return 0
        self._acquire()
        events = self._pending
        self._pending = []
        self._release()
        hooks = self._hooks
        for what, s, arg in events:
            if what == "ready":
                hooks.on_ready(s, arg)
            elif what == "answered":
                hooks.on_first_reply(s)
            elif what == "retire":
                hooks.on_retire(s)
            elif what == "init_failed":
                hooks.on_init_failed(s, arg)
            elif what == "corrupt":
                hooks.on_corrupt(s, arg)
        return len(events)

    # ---- driving: the waiting thread consumes results itself -----------------------

    def wait(self, fut, timeout=None):
        """Drives completions on this thread until fut settles or timeout passes."""
        return self._drive_until(fut, None, timeout)

    def drive(self, pred, timeout=None):
        """Drives completions on this thread until pred() or timeout.  Returns pred()."""
        return self._drive_until(None, pred, timeout)

    cdef bint _ok(self, object fut, object pred) except -1:
        # what a drive waits for: a future settled, the queue drained to a low-water
        # mark (pred an int: a blocked submit) or the pool closed, or pred() true
        if fut is not None:
            return is_done(fut)
        if type(pred) is int:
            return len(self._queue) <= <Py_ssize_t>pred or self._closed
        return bool(pred())

    cdef object _drive_until(self, object fut, object pred, object timeout):
        cdef double deadline = -1.0 if timeout is None else fp_now_ns() * 1e-9 + max(<double>timeout, 0.0)
        cdef double left
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef int got
        cdef long long us
        if self._driver == me:
            return self._drive_held(fut, pred, deadline)  # re-entered from a done-callback
        board = self.board
        board.want(1)  # keeps the collector thread off the rings while we drive
        try:
            while not self._ok(fut, pred):
                if self.torn_down:
                    return self._ok(fut, pred)
                left = _park_slice if deadline < 0 else deadline - fp_now_ns() * 1e-9
                if left <= 0:
                    return False
                got = PyThread_acquire_lock(self._drive, NOWAIT_LOCK)
                if not got:
                    us = <long long>(min(left, 0.001) * 1e6)
                    with nogil:
                        got = PyThread_acquire_lock_timed(self._drive, us, 0) == PY_LOCK_ACQUIRED
                if got:
                    self._driver = me
                    try:
                        return self._drive_held(fut, pred, deadline)
                    finally:
                        self._driver = 0
                        PyThread_release_lock(self._drive)
                # Another thread drives; it notifies _progress after each batch.
                with self._progress:
                    self._fg_waiting += 1
                    try:
                        if not self._ok(fut, pred):
                            self._progress.wait(min(left, _park_slice))
                    finally:
                        self._fg_waiting -= 1
            return True
        finally:
            self._last_fg = fp_now_ns()
            board.want(-1)

    cdef bint _drive_held(self, object fut, object pred, double deadline) except -1:
        cdef double spin = _parent_spin, left
        board = self.board
        while not self._ok(fut, pred):
            if self.collect():
                spin = _parent_spin
                continue
            if self.torn_down:
                return self._ok(fut, pred)
            left = _park_slice if deadline < 0 else min(_park_slice, deadline - fp_now_ns() * 1e-9)
            if left <= 0:
                return self._ok(fut, pred)
            board.wait_results(left, spin)
            PyErr_CheckSignals()
            spin = 0.0
        return True

    def collector_loop(self, handoff, should_stop):
        """The collector thread: settles what no caller thread is waiting for.

        It stays off the rings while caller threads drive or submit (and for
        COLLECTOR_GRACE_S after), so a caller's round trip wakes no second
        thread and workers skip the wake system call.  Returns when
        should_stop() says so or the dispatcher is torn down."""
        board = self.board
        cdef int n
        while not self.torn_down:
            if should_stop():
                return
            if board.wanted() or fp_now_ns() - self._last_fg < _grace_ns:
                handoff.wait(COLLECTOR_GRACE_S)
                handoff.clear()
                continue
            if not PyThread_acquire_lock(self._drive, NOWAIT_LOCK):
                handoff.wait(COLLECTOR_GRACE_S)
                handoff.clear()
                continue
            self._driver = PyThread_get_thread_ident()
            try:
                n = self.collect()
            except Exception:  # noqa: BLE001 - the collector must not die silently
                log.exception("fastpool collector failed")
                n = 0
            finally:
                self._driver = 0
                PyThread_release_lock(self._drive)
            if n == 0 and not board.wanted() and not self.torn_down:
                board.wait_results(PARK_SLICE_S, 0.0)
