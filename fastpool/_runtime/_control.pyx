# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""What supervision and teardown may do to the dispatcher's tasks and slots.

    a worker starts      slot_spawned (rings reset, K_INIT queued), slot_stopping
    a worker dies        drain_slot (its last results settle first), take_slot,
                         task_on (which task it ran), requeue, retry, fail, cancelled
    pool.cancel          cancel: queued -> dropped; held but not started -> skip words;
                         running -> cooperative flag, or the caller kills the worker
    memory, circuit      set_accepting, set_paused, set_circuit_open, take_queue
    shutdown             close, cancel_queued, abandon, set_torn_down
    stats                slot_view, counts, samples, tasks

Each method takes the dispatch lock itself and calls hooks only after
releasing it; the hot path lives in _dispatch.
"""

from cpython.pythread cimport WAIT_LOCK, PyThread_acquire_lock, PyThread_get_thread_ident, PyThread_release_lock
from libc.stdint cimport uint64_t

from fastpool import errors

from fastpool._native._core cimport FP_K_INIT
from fastpool._runtime._dispatch cimport C_CANCELLED, C_CHUNKS_CANCELLED, C_CHUNKS_FAILED, C_COMPLETED, C_FAILED
from fastpool._runtime._dispatch cimport C_ITEMS, C_RETRIED, SAMPLES, Dispatch
from fastpool._runtime._task cimport Task, is_done, notify_cancelled, wire_of

from fastpool._runtime._dispatch import COUNTER_NAMES


cdef class Dispatcher(Dispatch):
    """The dispatcher with supervision's handles (see the module docstring)."""

    def holding_drive(self):
        """True on the thread that consumes results right now (a done-callback there)."""
        return self._driver == PyThread_get_thread_ident()

    def lock_drive(self):
        """Takes the drive lock for the caller (teardown: nobody may be inside a wait)."""
        with nogil:
            PyThread_acquire_lock(self._drive, WAIT_LOCK)

    def unlock_drive(self):
        PyThread_release_lock(self._drive)


    def slot_spawned(self, int s, bytes init_payload, uint64_t req):
        """A new worker is starting in slot s: its rings are emptied (under the lock,
        so no reader is inside them), its K_INIT record queued, and nothing is
        known about it yet."""
        self._acquire()
        try:
            self.board.reset_slot(s)
            if not self.board.push_control(s, FP_K_INIT, init_payload, req):
                raise errors.SegmentCorrupt(f"slot {s}: a freshly reset task ring refused the K_INIT record")
            self._gen[s] += 1
            self._served[s] = 0
            self._skip_seq[s] = 0
            self._answered[s] = 0
            self._corrupt[s] = 0
            self._ready[s] = 0
            self._accepting[s] = 1
            self._flush[s] = 0
        finally:
            self._release()

    def slot_stopping(self, int s):
        """The worker in slot s takes nothing more (retired, stopped, killed)."""
        self._acquire()
        self._ready[s] = 0
        self._release()

    def set_accepting(self, int s, bint accepting):
        """Retiring (False): no more tasks.  Returns True if the slot is idle now."""
        self._acquire()
        self._accepting[s] = accepting
        idle = not self._assigned[s]
        if accepting and idle:
            self._to_idle(s)
            self._dispatch_locked()
        self._release()
        self._run_events()
        return idle

    def slot_view(self, int s):
        """(ready, accepting, served, assigned) for stats."""
        return (bool(self._ready[s]), bool(self._accepting[s]), self._served[s], len(self._assigned[s]))

    def drain_slot(self, int s):
        """Reads every record left in slot s's result ring and settles them (a dead
        worker's last results).  Only on the thread that holds the drive lock."""
        if self._driver != PyThread_get_thread_ident():
            raise RuntimeError("drain_slot needs the drive lock")
        cdef list settle = []
        self._acquire()
        try:
            if not self._corrupt[s]:
                self._read_slot(s, settle, self._pending, -1)
        finally:
            self._release()
        for task in settle:
            self._settle(<Task>task)
        self._run_events()

    def take_slot(self, int s):
        """Detaches every task slot s holds (in ring order) and takes the slot out
        of dispatch.  The caller decides each task's fate."""
        cdef int i, k = 0
        self._acquire()
        try:
            q = self._assigned[s]
            tasks = list(q)
            q.clear()
            self._ready[s] = 0
            for i in range(self._nidle):
                if self._idle[i] != s:
                    self._idle[k] = self._idle[i]
                    k += 1
            self._nidle = k
            self._in_idle[s] = 0
        finally:
            self._release()
        for t in tasks:
            (<Task>t).slot = -1
        return tasks

    def task_on(self, int s, uint64_t wire):
        """The task slot s holds under this wire id, or None."""
        if wire == 0:
            return None
        self._acquire()
        try:
            for t in self._assigned[s]:
                if wire_of(<Task>t) == wire:
                    return t
            return None
        finally:
            self._release()

    def requeue(self, tasks):
        """Puts tasks back at the front of the queue, in their order.  A task already
        settled (cancelled while a worker held it) is not run again."""
        self._acquire()
        try:
            for t in reversed(tasks):
                (<Task>t).slot = -1
                if not (<Task>t).settled:
                    self._queue.appendleft(t)
            self._dispatch_locked()
        finally:
            self._release()
        self._run_events()

    def retry(self, Task task):
        """A crash retry: the next attempt, at the front of the queue."""
        self._acquire()
        task.attempt += 1
        self._counts[C_RETRIED] += 1
        self._release()
        self.requeue([task])

    def fail(self, Task task, exc):
        """Settles task with exc (a crash verdict, a circuit, teardown)."""
        self._acquire()
        if self._inflight.pop(task.id, None) is not None:
            self._counts[C_CHUNKS_FAILED if task.items else C_FAILED] += 1
        self._release()
        self._finish(task, None, exc, False)

    def cancelled(self, Task task):
        """Settles task as cancelled (its worker was killed to cancel it)."""
        self._acquire()
        if self._inflight.pop(task.id, None) is not None:
            self._counts[C_CHUNKS_CANCELLED if task.items else C_CANCELLED] += 1
        self._release()
        self._finish(task, None, None, True)

    def drop_cancelled(self, Task task):
        """A future cancelled while queued: out of the queue now, waiters told."""
        fut = task.future
        if fut is None:
            return
        self._acquire()
        try:
            try:
                self._queue.remove(task)
            except ValueError:
                return  # dispatch took it meanwhile; it tells the waiters
            self._drop_locked(task)
        finally:
            self._release()
        self._flock.acquire()
        try:
            notify_cancelled(fut)
        finally:
            self._flock.release()

    def cancel(self, fut, bint force):
        """Pool.cancel, below the future's own cancel().  Returns (outcome, slot):
        "done" (it had settled: the caller returns False), "cancelled" (dropped
        before it ran: True), "flagged" (running; the cooperative flag is set:
        True) or "kill" (running; the caller kills slot's worker: True)."""
        cdef Task task = fut._task
        cdef int s = -1
        cdef bint dropped = False
        self._acquire()
        try:
            if task.settled or is_done(fut):
                return "done", -1
            task.cancel_requested = True
            s = task.slot
            if s < 0:
                # Back in the queue after a crash (its future says RUNNING): drop it here.
                try:
                    self._queue.remove(task)
                except ValueError:
                    return "flagged", -1  # between a worker's death and its requeue
                self._inflight.pop(task.id, None)
                self._counts[C_CHUNKS_CANCELLED if task.items else C_CANCELLED] += 1
                dropped = True
            else:
                # The worker checks its skip words before it starts a task (Dekker
                # with fp_slot_start): either it sees this request, or we see it
                # running.  A task that finished a moment ago settles as cancelled.
                started = not self.board.skip_task(s, self._skip_seq[s], wire_of(task))
                self._skip_seq[s] += 1
                if not started:
                    # It will never run: settled now, not when the worker reaches its
                    # record (its SKIPPED reply, or a result that beat the request, is
                    # matched later and dropped; the task keeps its place in the slot).
                    self._inflight.pop(task.id, None)
                    self._counts[C_CHUNKS_CANCELLED if task.items else C_CANCELLED] += 1
                    dropped = True
                elif force:
                    return "kill", s
                else:
                    self.board.request_cancel(s, wire_of(task))
                    return "flagged", s
        finally:
            self._release()
        if dropped:
            self._finish(task, None, None, True)
        return "cancelled", s

    def set_paused(self, bint paused):
        self._acquire()
        self._paused = paused
        if not paused:
            self._dispatch_locked()
        self._release()
        self._run_events()

    def set_circuit_open(self, bint is_open):
        self._circuit_open = is_open

    def take_queue(self):
        """Empties the queue and returns its tasks (every breaker is open)."""
        self._acquire()
        try:
            tasks = list(self._queue)
            self._queue.clear()
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
        self._acquire()
        try:
            tasks = list(self._queue)
            self._queue.clear()
            for t in tasks:
                if self._inflight.pop((<Task>t).id, None) is not None:
                    self._counts[C_CHUNKS_CANCELLED if (<Task>t).items else C_CANCELLED] += 1
        finally:
            self._release()
        for t in tasks:
            self._finish(<Task>t, None, None, True)
        return len(tasks)

    def settle_inline(self, Task task, value, exc):
        """A task the calling process ran itself (fallback="inline")."""
        self._acquire()
        if self._inflight.pop(task.id, None) is not None:
            if exc is None:
                self._counts[C_COMPLETED] += 1
            else:
                self._counts[C_FAILED] += 1
        self._release()
        self._finish(task, value, exc, False)

    def abandon(self, exc_factory):
        """Teardown: every task not settled yet fails with exc_factory(task)."""
        self._acquire()
        try:
            tasks = list(self._inflight.values())
            self._inflight.clear()
            self._queue.clear()
            for q in self._assigned:
                q.clear()
        finally:
            self._release()
        for t in tasks:
            self._finish(<Task>t, None, exc_factory(t), False)
        return len(tasks)

    def set_torn_down(self):
        self.torn_down = True
        self.board.kick()

    def idle_and_closed(self):
        """Closed and nothing in flight: the teardown may run."""
        return self._closed and not self._inflight

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
        return {name: self._counts[i] for i, name in enumerate(COUNTER_NAMES)}

    def samples(self):
        """(queue waits, run times) in ns, the latest up to 8192 of each."""
        cdef uint64_t n = min(self._nsamples, SAMPLES)
        return ([self._wait_samples[i] for i in range(n)], [self._run_samples[i] for i in range(n)])

    def functions(self):
        """Functions registered so far (id order)."""
        return sorted(self._fns_by_data.values(), key=lambda f: f.id)


