# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The dispatch loop: the path of a task from submit to settle, compiled.

    submit(fn, args) ------------------------------------------------------------+
      fn -> Fn (id, pickle; sent to a worker once)   args -> pickle (or descriptors)
      lock: in-flight map, FIFO queue -> a slot (Slots.pick: the LIFO idle stack, or
            the least-loaded one while tasks are short: prefetch) -> its task ring
                                                                                 |
    board result rings ====> collect() on the thread that waits (or the collector)
      lock: match each reply to the exact attempt its slot holds (task id + attempt),
            unknown replies dropped; capacity back to the slot; queued work
            dispatched  -- all BEFORE any future settles --
      then, unlocked: _settle each one (decode, count, state, done-callbacks)

    every way a task ends goes through _settle: a reply, a death (settle_death),
    a cancel, an inline run, a circuit that opened, teardown (abandon).

    supervision (Python, _supervisor) reaches in through the eight methods of
    _controls.Dispatcher, the subclass the pool makes (with cancel, shutdown and the
    views), and hears back through on_event(SlotEvent), on_attention() and
    circuit_error(), called with no lock held (circuit_error: under the lock, it
    reads breakers only).

Locks, in the only order they are taken: the dispatch lock (a C lock, never held
across a blocking call) then the futures' lock (the RLock every PoolFuture
shares, which concurrent.futures.wait/as_completed take).  The drive lock
(one consumer of the result rings) is taken before either.  No user code (a
done-callback, an unpickled result) ever runs under the dispatch lock.
"""

cimport cython

import logging
import threading
from collections import deque
from concurrent.futures import _base

from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (
    NOWAIT_LOCK, WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_get_thread_ident, PyThread_release_lock, PyThread_type_lock,
)

cdef extern from "pythread.h" nogil:
    ctypedef enum PyLockStatus:
        PY_LOCK_FAILURE, PY_LOCK_ACQUIRED, PY_LOCK_INTR
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                             int intr_flag)
from libc.stdint cimport int64_t, uint32_t, uint64_t

from fastpool import errors
from fastpool._native._core import ring_limit_error
from fastpool._runtime import _call, _codec
from fastpool._runtime._arrays import CopyMemo
from fastpool._runtime._events import Happened, SlotEvent

from fastpool._native._core cimport (
    FP_R_BAD_RESULT, FP_R_OK, Board, fp_now_ns,
)
from fastpool._native._sys cimport FP_AGAIN, FP_OK
from fastpool._runtime._slots cimport Slots
from fastpool._runtime._task cimport (
    C_BAD_RESULTS, C_CHUNKS, C_INLINE, C_SUBMITTED, END_CANCELLED, END_DONE, END_FAILED,
    END_INLINE, END_REPLY, Fn, Ledger, Registry, Task, decode_reply, drop_result, encode_call,
    encode_chunk, is_done, new_future, run_callbacks, settle_future,
)

from fastpool._runtime._task import COUNTER_NAMES

log = logging.getLogger("fastpool")

cdef object _PENDING = _base.PENDING
cdef object _RUNNING = _base.RUNNING
cdef object _run_call = _call.run

cdef enum:
    READ_BUDGET = 256  # records per slot per collect round: one busy worker cannot starve the rest

PARK_SLICE_S = 0.05         # every wait returns this often, so Ctrl-C and deadlines are seen
COLLECTOR_GRACE_S = 0.002   # the collector stays away this long after a caller drove or submitted
NAP_AFTER_S = 0.005         # one drive this long: the collector sleeps until it ends
IDLE_PARK_S = 30.0          # the collector's wait while nothing is in flight
cdef double _park_slice = PARK_SLICE_S
cdef int64_t _grace_ns = <int64_t>(COLLECTOR_GRACE_S * 1e9)
cdef int64_t _nap_after_ns = <int64_t>(NAP_AFTER_S * 1e9)
cdef double _parent_spin = 80e-6

# unique across pools; bumped with the GIL held and nothing between
cdef uint64_t _next_task_id = 1


def set_parent_spin(double seconds):
    """How long a waiting thread spins on the result rings before it parks."""
    global _parent_spin
    _parent_spin = seconds


cdef class DispatchCore:
    """The pool's queue and in-flight map, its slots (Slots), its function registry,
    and the submit, completion, settle and driving paths between them (see the
    module docstring).  The pool makes its subclass, _controls.Dispatcher.

    Thread safety: every public method may be called from any thread; the
    collection methods that need the drive lock take it."""

    def __cinit__(self, Board board, int nslots, *args, **kwargs):
        self._lock = PyThread_allocate_lock()
        self._drive = PyThread_allocate_lock()
        if self._lock == NULL or self._drive == NULL:
            raise MemoryError()

    def __init__(self, Board board, int nslots, *, Py_ssize_t max_queue, bint reject,
                 queue_timeout, max_tasks, arena, hooks):
        self.board = board
        self.nslots = nslots
        self._slots = Slots(board, nslots, max_tasks)
        self._fns = Registry(nslots)
        self._fns.ride_bytes = board.max_record // 2  # the call's own pickle gets the rest
        self._ledger = Ledger()
        self._queue = deque()
        self._pinned = [deque() for _ in range(nslots)]
        self._inflight = {}
        self.max_queue = max_queue
        self._reject = reject
        self._queue_timeout = -1.0 if queue_timeout is None else queue_timeout
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

    def set_hooks(self, hooks):
        """The supervision object: on_event, on_attention, circuit_error (module doc)."""
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

    def holding_drive(self):
        """True on the thread that consumes results right now (a done-callback there)."""
        return self._driver == PyThread_get_thread_ident()

    def lock_drive(self):
        """Takes the drive lock for the caller (teardown: nobody may be inside a wait)."""
        with nogil:
            PyThread_acquire_lock(self._drive, WAIT_LOCK)

    def unlock_drive(self):
        PyThread_release_lock(self._drive)

    # ---- submit ----------------------------------------------------------------------

    cdef Fn _fn(self, object fn, bint chunk):
        cdef bint reset = False
        cdef Fn f = self._fns.get(fn, chunk, &reset)
        if reset:
            self._slots.forget_functions()
        return f

    cdef Fn _encode_call(self, Task task, object fn, tuple args, dict kwargs):
        # fn's entry, and the call encoded into task: fn among the arguments if it rides
        cdef Fn f = self._fn(fn, False)
        encode_call(task, ((fn,) + args) if f.rides else args, kwargs, self._arena)
        return f

    def submit(self, fn, tuple args, dict kwargs, options=None, bint wait=True):
        """Queues fn(*args, **kwargs); returns its PoolFuture.  Raises before
        anything is queued: PoolClosed, SerializationError (naming the bad
        argument), QueueFull (at once when wait is False, whatever on_full
        says: asyncio's admission must never block its loop), CircuitOpen."""
        if self._closed:
            raise errors.PoolClosed()
        cdef Task task = Task.__new__(Task)
        cdef Fn f = self._encode_call(task, fn, args, kwargs)
        return self._submit_task(task, f, options, 0, wait)

    def submit_chunk(self, fn, items, bint star, bint wait=True, memo=None):
        """Queues one map chunk: fn(item) (or fn(*item)) for each item, in a worker.
        ``memo``: the map's CopyMemo, one copy into shared memory per array for all
        the chunks of that map (docs/arrays.md); None: this chunk's own copies."""
        if self._closed:
            raise errors.PoolClosed()
        cdef Fn f = self._fn(fn, True)
        cdef Task task = Task.__new__(Task)
        if memo is None:
            memo = CopyMemo()
        if f.rides:
            encode_call(task, (fn, items, star), {}, self._arena, memo)
        else:
            encode_chunk(task, items, star, self._arena, memo)
        return self._submit_task(task, f, None, len(items), wait)

    def submit_to(self, int s, fn, tuple args, dict kwargs):
        """Queues fn(*args, **kwargs) for slot s's worker only (Pool.run_on_workers):
        it is pushed to that worker's ring as soon as the worker is ready, whatever it
        holds, ahead of the shared queue, and never waits for queue room.  Raises as
        ``submit``.  Never runs on another worker: supervision decides what a death
        does to it (see _supervisor._judge)."""
        if self._closed:
            raise errors.PoolClosed()
        if not 0 <= s < self.nslots:
            raise ValueError(f"no worker slot {s}")
        cdef Task task = Task.__new__(Task)
        cdef Fn f = self._encode_call(task, fn, args, kwargs)
        task.pin = s + 1
        return self._submit_task(task, f, None, 0, False)

    cdef object _submit_task(self, Task task, Fn f, object options, Py_ssize_t items, bint wait):
        cdef Py_ssize_t size = PyBytes_GET_SIZE(f.data) + PyBytes_GET_SIZE(task.args)
        if <uint64_t>size > self.board.max_record:
            # A pickle too large for the ring travels in shared memory, as a large result does.
            if task.keep is None:
                task.keep = []
            task.args = _codec.spill(task.args, self._arena, task.keep)
            size = PyBytes_GET_SIZE(f.data) + PyBytes_GET_SIZE(task.args)
        if <uint64_t>size > self.board.max_record:  # a ring smaller than a spilled call's stub
            raise ring_limit_error(f"the call of {f.name!r}", size, self.board.max_record,
                                   "raise Pool(ring_bytes=...). Nothing was submitted")
        task.fn = f
        task.options = options
        task.items = items
        task.slot = -1
        task.t_submit = fp_now_ns()
        fut = new_future(self, self._fcond, task)
        task.future = fut
        self._last_fg = task.t_submit
        # Settled first: a worker whose last result waits uncollected counts as busy,
        # and the task would go to an idle one that may share this thread's CPU.
        if not task.pin:
            self._collect_if_free()
        self._enqueue(task, wait)
        return fut

    cdef object _enqueue(self, Task task, bint wait):
        global _next_task_id
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef double deadline = -1.0, left
        cdef Py_ssize_t low
        cdef bint wake = False
        self._acquire()
        try:
            while True:
                if self._closed:
                    raise errors.PoolClosed()
                if self._circuit_open:
                    exc = self._hooks.circuit_error()
                    if exc is not None:
                        raise exc
                if len(self._queue) < self.max_queue or self._driver == me or task.pin:
                    break  # a callback on the driving thread never blocks: it would wait on itself
                if self._reject or not wait:
                    raise errors.QueueFull(self.max_queue)
                if deadline < 0 and self._queue_timeout >= 0:
                    deadline = fp_now_ns() * 1e-9 + self._queue_timeout
                if deadline >= 0 and fp_now_ns() * 1e-9 >= deadline:
                    raise errors.QueueFull(self.max_queue, self._queue_timeout)
                self._release()
                try:  # drive completions ourselves: that is what makes room
                    left = _park_slice if deadline < 0 else \
                        min(_park_slice, deadline - fp_now_ns() * 1e-9)
                    # drain to a low-water mark, not one slot: one drive per many submits
                    low = self.max_queue - max(1, self.max_queue // 4)
                    self._drive_until(None, low, max(left, 0.0))
                finally:
                    self._acquire()
            task.id = _next_task_id
            _next_task_id += 1
            self._inflight[task.id] = task
            if self.idle_watch:  # after the insert: the supervisor sets it, then reads inflight
                self.idle_watch = False
                wake = True
            self._ledger.add(C_CHUNKS if task.items else C_SUBMITTED, 1)
            if task.pin:
                self._pinned[task.pin - 1].append(task)
                self._npinned += 1
            else:
                self._queue.append(task)
            self._dispatch_locked()
        finally:
            self._release()
        if wake:
            self._hooks.wake()  # supervision slept with nothing in flight: time this task
        self._run_events()

    cdef int _collect_if_free(self) except -2:
        # Settles what is ready while no thread drives: the count, or -1 if one does.
        # A submitting thread calls it (no thread hand-off, the collector stays asleep),
        # and so does the collector thread; neither may die of a failed collect.
        if self._driver != 0 or not PyThread_acquire_lock(self._drive, NOWAIT_LOCK):
            return -1
        self._driver = PyThread_get_thread_ident()
        try:
            return self.collect()
        except BaseException:
            log.exception("fastpool: collecting results failed")
            return 0
        finally:
            self._driver = 0
            PyThread_release_lock(self._drive)

    # ---- dispatch (lock held) ------------------------------------------------------

    cdef int _dispatch_locked(self) except -1:
        cdef int s, rc
        cdef Task task
        cdef bint flocked = False
        cdef Slots slots = self._slots
        queue = self._queue
        if self._paused:
            return 0  # memory pressure: feeding workers now would feed the OOM killer
        if self._npinned:
            self._push_pinned()
        try:
            while queue:
                s = slots.pick(self._ledger.prefetch())
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
                        self._settle(task, END_CANCELLED, None, None)
                        slots.to_idle(s)
                        continue
                    task.t_dispatch = fp_now_ns()
                rc = slots.push(s, task)
                if rc == FP_OK:
                    continue
                queue.appendleft(task)
                if rc == FP_AGAIN:  # ring full: the slot is busy enough
                    if not slots.held(s):
                        slots.to_idle(s)
                    break
                # The worker wrote its task ring's head: it can take nothing more.
                slots.mark_corrupt(s, "its task ring's head was overwritten", self._pending)
        finally:
            if flocked:
                self._flock.release()
        return 0

    cdef int _push_pinned(self) except -1:
        # Calls addressed to one slot go to its ring once its worker is ready, ahead of
        # the shared queue: behind what the worker holds, never behind queued work.
        cdef int s, rc
        cdef Task task
        cdef Slots slots = self._slots
        for s in range(self.nslots):
            q = self._pinned[s]
            while q and slots.takes_pinned(s):
                task = q[0]
                if task.t_dispatch == 0:
                    with self._flock:
                        fut = task.future
                        if fut._state is not _PENDING:  # cancelled while it waited
                            q.popleft()
                            self._npinned -= 1
                            self._settle(task, END_CANCELLED, None, None)
                            continue
                        fut._state = _RUNNING
                    task.t_dispatch = fp_now_ns()
                rc = slots.push(s, task)
                if rc == FP_AGAIN:  # ring full: the next dispatch retries
                    break
                q.popleft()
                self._npinned -= 1
                if rc == FP_OK:
                    slots._take_idle(s)
                    continue
                q.appendleft(task)
                self._npinned += 1
                slots.mark_corrupt(s, "its task ring's head was overwritten", self._pending)
                break
        return 0

    cdef list _take_pinned(self, int s):
        # the calls addressed to slot s and not pushed yet (dispatch lock held)
        q = self._pinned[s]
        tasks = list(q)
        q.clear()
        self._npinned -= len(tasks)
        return tasks

    cdef bint _unqueue(self, Task task) except -1:
        # task out of the queue (or its slot's list of addressed calls) before a worker
        # got it: True, else False (dispatch lock held)
        try:
            if task.pin:
                self._pinned[task.pin - 1].remove(task)
                self._npinned -= 1
            else:
                self._queue.remove(task)
        except ValueError:
            return False
        return True

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
                if self._slots.readable(s) and self.board.results_pending(s):
                    n += self._read_slot(s, settle, READ_BUDGET)
            self._next_poll = (start + 1) % self.nslots
            if n and (self._queue or self._npinned):
                self._dispatch_locked()  # capacity returns BEFORE any future settles
        finally:
            self._release()
        cdef list later
        if settle:
            later = []
            for task in settle:
                self._settle(<Task>task, END_REPLY, None, None, later)
            if later:
                run_callbacks(later)
        if self._discard:
            self._acquire()
            dropped, self._discard = self._discard, []
            self._release()
            for payload, src in dropped:
                drop_result(payload, self._arena, src)
        n += self._run_events()
        if self.board.take_attention():
            n += 1
            self._hooks.on_attention()
        if n and self._fg_waiting:
            with self._progress:
                self._progress.notify_all()
        return n

    cdef int _read_slot(self, int s, list settle, Py_ssize_t budget) except -1:
        return self._slots.read(s, settle, self._discard, self._pending, self._ledger, budget)

    # ---- settle: the one way a task ends ----------------------------------------------

    cdef int _settle(self, Task task, int outcome, object value, object exc,
                     list later=None) except -1:
        """Ends task: every path comes here (a reply, a death, a cancel, an inline run,
        a circuit that opened, teardown).  outcome END_REPLY decodes the worker's
        reply first; END_INLINE runs the call (value: (fn, args, kwargs), or None
        to rebuild it from the task) in this process first.

        The only place that catches what user code raises in the parent (a result's
        unpickling, an inline call, done-callbacks in settle_future): whatever it
        raises, BaseException included, ends up on the future, and the thread that
        settles goes on.  Takes no dispatch lock: callers may hold it only for a
        future its own caller cancelled (no callbacks run then).  A caller that
        settles a batch passes later and runs its callbacks after the batch."""
        cdef bint decoding = outcome == END_REPLY
        if task.settled:
            return 0
        task.settled = True  # no Python call since the test: a second settle stops above
        fut = task.future
        if decoding or outcome == END_INLINE:
            try:
                if decoding:
                    if task.rkind == FP_R_BAD_RESULT:
                        self._ledger.add(C_BAD_RESULTS, 1)
                        self._pending.append(SlotEvent(Happened.BAD_RESULT, task.slot, task))
                    outcome, value, exc = decode_reply(task, self._arena)
                else:
                    fn, args, kwargs = task.decode_call() if value is None else value
                    self._ledger.add(C_INLINE, 1)
                    outcome, value = END_DONE, _run_call(fn, args, kwargs)
            except BaseException as err:  # noqa: BLE001 - user code: it ends on this future
                outcome, value, exc = END_FAILED, None, err
                if decoding and task.rkind == FP_R_OK:  # the parent cannot rebuild the result
                    exc = errors.SerializationError(f"the result of task {task.id}",
                                                    f"unpickling failed in the parent: {err!r}")
                    exc.__cause__ = err
        task.keep = None  # the call's shared blocks may go now
        task.future = None  # Task is not GC-tracked: the future -> task -> future cycle ends here
        if self._inflight.pop(task.id, None) is not None:
            self._ledger.ended(task, outcome, value)
        if fut is not None:
            settle_future(fut, self._flock, self._fcond, value, exc, outcome == END_CANCELLED,
                          later)
        return 0

    cdef int _run_events(self) except -1:
        """Tell supervision what the last locked sections saw, with no lock held."""
        if not self._pending:
            return 0
        self._acquire()
        events = self._pending
        self._pending = []
        self._release()
        for ev in events:
            self._hooks.on_event(ev)
        return len(events)

    # ---- the inline run: a task that never leaves this process ----------------------

    def run_inline(self, fn, tuple args, dict kwargs):
        """Degraded mode (fallback="inline", every breaker open): runs fn(*args,
        **kwargs) in this process now and returns its settled PoolFuture, whose
        result() raises what fn raised."""
        global _next_task_id
        cdef Task task = Task.__new__(Task)
        task.id = _next_task_id
        _next_task_id += 1
        task.slot = -1
        fut = new_future(self, self._fcond, task)
        fut._state = _RUNNING
        task.future = fut
        self._settle(task, END_INLINE, (fn, args, kwargs), None)
        return fut

    # ---- driving: the waiting thread consumes results itself -----------------------

    def wait(self, fut, timeout=None):
        """Drives completions on this thread until fut settles or timeout passes.

        With no timeout it returns only once fut settled: a future that the pool,
        torn down, can no longer settle fails here with BrokenPool, so that
        result(timeout=None) never raises TimeoutError."""
        if self._drive_until(fut, None, timeout) or timeout is not None or is_done(fut):
            return True if timeout is None else is_done(fut)
        task = fut._task
        self._settle(<Task>task, END_FAILED, None, errors.BrokenPool(
            f"the pool was shut down before task {(<Task>task).id} settled"))
        return True

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
        cdef double deadline = (
            -1.0 if timeout is None else fp_now_ns() * 1e-9 + max(<double>timeout, 0.0))
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
            self._drives_ended += 1
            board.want(-1)
            # No Python code runs between the collector's setting _napping and its
            # reading want and _drives_ended (the GIL), nor between these lines: one of
            # the two sees the other, so a drive never ends unseen by a napping collector.
            if self._napping:
                self._napping = False
                self._handoff.set()

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
        cdef unsigned long long seen = self._drives_ended
        cdef int64_t since = fp_now_ns()
        cdef double wait
        self._handoff = handoff
        while not self.torn_down:
            if should_stop():
                return
            n = -1
            if not board.wanted() and fp_now_ns() - self._last_fg >= _grace_ns:
                n = self._collect_if_free()
            if n < 0:  # a caller drives or submits, or just did: it settles its own
                wait = COLLECTOR_GRACE_S
                if not board.wanted() or self._drives_ended != seen:
                    seen, since = self._drives_ended, fp_now_ns()
                if board.wanted() and fp_now_ns() - since < _nap_after_ns:
                    # A drive runs: look again when it could have run long enough to nap
                    # on, not every grace period meanwhile (a map of 50 ms tasks woke
                    # this thread 4 times a result, each wake a busy CPU's preemption).
                    # A drive that ends sooner leaves what comes after it to us for up
                    # to NAP_AFTER_S instead of COLLECTOR_GRACE_S.
                    wait = max(wait, (_nap_after_ns - (fp_now_ns() - since)) * 1e-9)
                elif board.wanted() and self._drives_ended == seen:
                    # One drive has run this long (a map of long tasks, a result() of
                    # one): it settles all that comes meanwhile, and its end wakes us.
                    # Polling every 2 ms through it cost ~10 ms of CPU a second,
                    # taken from the workers on a small machine (measured).
                    self._napping = True
                    if board.wanted() and self._drives_ended == seen:
                        wait = _park_slice
                handoff.wait(wait)
                self._napping = False
                handoff.clear()
            elif n == 0 and not board.wanted() and not self.torn_down:
                # Nothing in flight: no reply can come, and whatever ends the loop (a
                # shutdown, the teardown, a death) kicks the board.  The bound is a backstop.
                board.wait_results(PARK_SLICE_S if self._inflight else IDLE_PARK_S, 0.0)
