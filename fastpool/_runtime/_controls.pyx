# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""What the rest of the pool does to the tasks in flight: the controls of the dispatcher.

    supervision (_supervisor) -> its eight methods: slot_spawned / slot_stopping /
        set_accepting / slot_view / task_on / settle_death / set_paused / set_circuit
    the caller -> cancel (Pool.cancel), drop_cancelled (a queued future's cancel());
        submit_to (in _dispatch: a call addressed to one slot, Pool.run_on_workers)
    shutdown -> close, cancel_queued, abandon, set_torn_down
    a forked child -> disown
    stats -> depth, inflight, queued, tasks, counts, samples

Dispatcher is the class the pool makes: _dispatch.DispatchCore (the path of a task
from submit to settle, and the driving of results) with these on top.  Every task
these end goes through the core's one settle function (_settle), and they take the
core's locks in its order (see fastpool/_runtime/_dispatch.pyx).
"""

from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport uint64_t

from concurrent.futures._base import FINISHED as _FINISHED

from fastpool._runtime._events import Fate

from fastpool._runtime._dispatch cimport DispatchCore
from fastpool._runtime._slots cimport HELD_FLAGGED, HELD_KILL
from fastpool._runtime._task cimport (
    C_RETRIED, END_CANCELLED, END_FAILED, END_INLINE, END_REPLY, Task, is_done, run_callbacks,
)

cdef extern from "Python.h":
    void PyObject_GC_Track(object)
    int PyObject_GC_IsTracked(object)

cdef object _FATE_REQUEUE = Fate.REQUEUE
cdef object _FATE_RETRY = Fate.RETRY
cdef object _FATE_CANCEL = Fate.CANCEL


cdef class Dispatcher(DispatchCore):
    """The dispatcher a pool holds (see the module docstring).

    Thread safety: every public method may be called from any thread; ``settle_death``
    drains a dead worker's ring only on the thread that holds the drive lock
    (``on_attention``)."""

    # ---- supervision's eight methods -------------------------------------------------

    def slot_spawned(self, int s, bytes init_payload, uint64_t req):
        """A new worker is starting in slot s: its rings are emptied (under the lock,
        so no reader is inside them), its K_INIT record queued, and nothing is
        known about it yet."""
        self._acquire()
        try:
            self._slots.spawned(s, init_payload, req)
        finally:
            self._release()

    def slot_stopping(self, int s):
        """The worker in slot s takes nothing more (retired, stopped, killed)."""
        self._acquire()
        self._slots.stopping(s)
        self._release()

    def set_accepting(self, int s, bint accepting):
        """Retiring (False): no more tasks.  Returns True if the slot is idle now."""
        self._acquire()
        try:
            idle = self._slots.set_accepting(s, accepting)
            if accepting and idle:
                self._dispatch_locked()
        finally:
            self._release()
        self._run_events()
        return idle

    def slot_view(self, int s):
        """(ready, accepting, served, assigned) for stats."""
        self._acquire()
        try:
            return self._slots.view(s)
        finally:
            self._release()

    def task_on(self, int s, uint64_t wire):
        """The task slot s holds under this wire id, or None.  wire 0 (the worker's
        slot word names no task): the oldest task the slot holds while no reply from
        it waits unread, the one its worker must be running or about to run (the word
        is the worker's to write, and a task may have zeroed it); else None."""
        self._acquire()
        try:
            if wire == 0:
                if self._slots.held(s) == 0 or self.board.results_pending(s):
                    return None
                return self._slots.oldest(s)
            return self._slots.task_on(s, wire)
        finally:
            self._release()

    def settle_death(self, int s, judge):
        """A dead (or never started) worker's tasks, each to its fate.

        On the thread that holds the drive lock, what the worker published before
        it died settles first: those tasks finished, and are neither run again nor
        judged.  Then every task the slot holds is taken off it (ring order) and
        ``judge(tasks)`` (called with no dispatcher lock held) returns a
        ``(task, Fate, exception)`` for each: REQUEUE and RETRY go back to the front
        of the queue (retries first: the task that ran), FAIL and CANCEL settle."""
        cdef list settle = []
        cdef list front = []
        cdef list later = []
        if self._driver == PyThread_get_thread_ident():
            self._acquire()
            try:
                if self._slots.readable(s):
                    self._read_slot(s, settle, -1)
            finally:
                self._release()
            for t in settle:
                self._settle(<Task>t, END_REPLY, None, None, later)
        self._acquire()
        try:  # then the calls addressed to it that it never got (t_dispatch 0 or not pushed)
            tasks = self._slots.take(s) + self._take_pinned(s)
        finally:
            self._release()
        rulings = judge(tasks)
        retries = [t for t, fate, _ in rulings if fate is _FATE_RETRY]
        self._acquire()
        try:
            for t in retries:
                (<Task>t).attempt += 1
                self._ledger.add(C_RETRIED, 1)
            front = retries + [t for t, fate, _ in rulings if fate is _FATE_REQUEUE]
            dropped = []
            for t in reversed(front):
                if (<Task>t).settled:  # cancelled while a worker held it: not run again
                    continue
                if (<Task>t).cancel_requested:  # pool.cancel() came between death and requeue
                    dropped.append(t)
                    continue
                if (<Task>t).pin:  # addressed to this slot: its next worker takes it
                    self._pinned[(<Task>t).pin - 1].appendleft(t)
                    self._npinned += 1
                    continue
                self._queue.appendleft(t)
            self._dispatch_locked()
        finally:
            self._release()
        for t in dropped:
            self._settle(<Task>t, END_CANCELLED, None, None, later)
        for t, fate, exc in rulings:
            if fate is _FATE_CANCEL:
                self._settle(<Task>t, END_CANCELLED, None, None, later)
            elif fate is not _FATE_REQUEUE and fate is not _FATE_RETRY:
                self._settle(<Task>t, END_FAILED, None, exc, later)
        run_callbacks(later)
        self._run_events()

    def set_paused(self, bint paused):
        """Memory pressure: nothing is dispatched while paused."""
        self._acquire()
        self._paused = paused
        if not paused:
            self._dispatch_locked()
        self._release()
        self._run_events()

    def set_circuit(self, exc, bint drain=True):
        """exc (a CircuitOpen): every breaker is open.  Submits ask circuit_error()
        and raise, and every queued task ends now: one with fallback="inline" runs
        in this process, the others fail with exc.  None: the circuit is closed.
        drain=False only opens it (for a caller holding a lock that settling, which runs
        done-callbacks, must not run under); a later call drains the queue."""
        self._circuit_open = exc is not None
        if exc is None or not drain:
            return
        cdef list later = []
        for t in self._take_queue():
            options = (<Task>t).options
            if options is not None and options.fallback == "inline":
                self._settle(<Task>t, END_INLINE, None, None, later)
            else:
                self._settle(<Task>t, END_FAILED, None, exc, later)
        run_callbacks(later)

    # ---- the caller's other ends: cancel, shutdown ------------------------------------

    def drop_cancelled(self, Task task):
        """A future cancelled while queued: out of the queue now, waiters told."""
        if task.future is None:
            return
        self._acquire()
        try:
            if not self._unqueue(task):
                return  # dispatch took it meanwhile; it tells the waiters
            self._settle(task, END_CANCELLED, None, None)  # its caller ran the callbacks
        finally:
            self._release()

    def cancel(self, fut, bint force):
        """Pool.cancel, below the future's own cancel().  Returns (outcome, slot):
        "done" (it had settled), "cancelled" (dropped before it ran, settled now),
        "dropping" (its worker died and it waits for its requeue, which drops it and
        settles it cancelled), "kill" (running; the caller kills slot's worker) or
        "asked" (running; only the cooperative flag is set: the task runs on until it
        returns, and is settled cancelled then)."""
        cdef Task task = fut._task
        cdef int s = -1
        self._acquire()
        try:
            if task.settled or is_done(fut):
                return "done", -1
            task.cancel_requested = True
            s = task.slot
            if s < 0:
                # Back in the queue after a crash (its future says RUNNING), or a call
                # addressed to a slot that it waits for: drop it here.
                if not self._unqueue(task):
                    return "dropping", -1  # between a worker's death and its requeue
            else:
                held = self._slots.cancel_held(s, task, force)
                if held == HELD_KILL:
                    return "kill", s
                if held == HELD_FLAGGED:
                    return "asked", s
        finally:
            self._release()
        self._settle(task, END_CANCELLED, None, None)
        return "cancelled", s

    cdef list _take_queue(self, bint pinned=False):
        cdef int s
        self._acquire()
        try:
            tasks = list(self._queue)
            self._queue.clear()
            if pinned:
                for s in range(self.nslots):
                    tasks += self._take_pinned(s)
            return tasks
        finally:
            self._release()

    def close(self):
        """No new submits (PoolClosed)."""
        self._closed = True

    @property
    def closed(self):
        return self._closed

    def cancel_queued(self):
        """Cancels every task no worker holds (shutdown(cancel_futures=True))."""
        cdef list later = []
        tasks = self._take_queue(True)
        for t in tasks:
            self._settle(<Task>t, END_CANCELLED, None, None, later)
        run_callbacks(later)
        return len(tasks)

    def abandon(self, exc_factory):
        """Teardown: every task not settled yet fails with exc_factory(task)."""
        self._acquire()
        try:
            tasks = list(self._inflight.values())
            self._queue.clear()
            for q in self._pinned:
                q.clear()
            self._npinned = 0
            self._slots.clear()
        finally:
            self._release()
        cdef list later = []
        for t in tasks:
            self._settle(<Task>t, END_FAILED, None, exc_factory(t), later)
        run_callbacks(later)
        return len(tasks)

    def set_torn_down(self):
        self.torn_down = True
        self.board.kick()

    def disown(self, exc_factory):
        """In a forked child (``Runtime.disown``, from an at-fork hook): this copy of the
        dispatcher never drives again, and every future it had not settled fails here with
        exc_factory(task), so the child's ``result()``, ``wait`` and ``as_completed`` end
        at once instead of reading the board, whose pages the parent's workers still write
        until the child touches them.  The parent's copies are untouched.

        Takes no lock and runs no callback: a thread of the parent may have held either
        at the fork, and neither the callbacks nor the waiters' threads are this
        process's.  The child runs one thread, so no other one can race these writes."""
        self._closed = True
        self.torn_down = True
        for task in list(self._inflight.values()):
            fut = (<Task>task).future
            if fut is not None and not is_done(fut):
                if not PyObject_GC_IsTracked(fut):  # an exception may lead back to it
                    PyObject_GC_Track(fut)
                fut._exception = exc_factory(task)
                fut._state = _FINISHED

    # ---- views ------------------------------------------------------------------------

    @property
    def depth(self):
        """Prefetch: how many tasks a worker may hold (from recent run times)."""
        return self._ledger.prefetch()

    @property
    def inflight(self):
        return len(self._inflight)

    @property
    def queued(self):
        return len(self._queue)

    def tasks(self):
        """A snapshot of the tasks accepted and not settled."""
        self._acquire()
        try:
            return list(self._inflight.values())
        finally:
            self._release()

    def counts(self):
        return self._ledger.counts()

    def samples(self):
        """(queue waits, run times) in ns, the latest up to 8192 of each."""
        return self._ledger.samples()
