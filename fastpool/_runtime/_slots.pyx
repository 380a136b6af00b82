# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The worker slots as the dispatcher sees them: which tasks each holds, which are
idle, and where each is in its life.  One owner for every per-slot word.

    lifecycle   spawned -> ready (READY record) -> [retiring: not accepting] -> stopping
                corrupt: its rings broke their format; nothing more is read or sent
    dispatch    pick (LIFO idle stack, or the least-loaded slot while tasks are short),
                push (the task record, the function's pickle once per worker), held
    replies     read a slot's result ring: match each reply to the exact attempt the
                slot holds; replied (served count, max_tasks, idle again or retire)

Every method runs under the dispatcher's lock (its caller holds it); what
supervision must hear about goes into the caller's event list as SlotEvents.
"""

from collections import deque

from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

from fastpool import errors
from fastpool._runtime._events import Happened, SlotEvent

from fastpool._native._core cimport (
    FP_AUX_HANDOFFS, FP_K_INIT, FP_R_BAD_RESULT, FP_R_ERR, FP_R_INIT_FAILED, FP_R_OK, FP_R_READY,
    FP_R_SKIPPED, Board, fp_aux_call, fp_cpu_tag, fp_recv_t,
)
from fastpool._native._sys cimport FP_AGAIN, FP_OK
from fastpool._runtime._task cimport C_UNKNOWN, Fn, Ledger, Task, wire_of

cdef object _READY = Happened.READY
cdef object _FIRST_REPLY = Happened.FIRST_REPLY
cdef object _RETIRE = Happened.RETIRE
cdef object _INIT_FAILED = Happened.INIT_FAILED


cdef class Slots:
    """Per-slot dispatch state (see the module docstring).  Not thread-safe by
    itself: the dispatcher's lock guards every call."""

    def __cinit__(self, Board board, int nslots, max_tasks):
        self._board = board
        self._n = nslots
        self._max_tasks = 0 if max_tasks is None else max_tasks
        self._held = [deque() for _ in range(nslots)]
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
        if (self._idle == NULL or self._in_idle == NULL or self._ready == NULL
                or self._accepting == NULL or self._answered == NULL or self._corrupt == NULL
                or self._flush == NULL or self._gen == NULL or self._served == NULL
                or self._skip_seq == NULL):
            raise MemoryError()
        for s in range(nslots):
            self._gen[s] = 1  # Fn.known starts at 0: nobody holds a function yet

    def __dealloc__(self):
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

    # ---- dispatch ------------------------------------------------------------------

    cdef bint accepts(self, int s) except -1:
        if not self._ready[s] or not self._accepting[s] or self._corrupt[s]:
            return False
        return (self._max_tasks == 0
                or self._served[s] + <uint64_t>len(self._held[s]) < self._max_tasks)

    cdef bint takes_pinned(self, int s) noexcept:
        # A call addressed to s (Pool.run_on_workers): whatever the worker holds, and
        # past max_tasks_per_worker, which retires the worker after it
        return self._ready[s] and self._accepting[s] and not self._corrupt[s]

    cdef void to_idle(self, int s) noexcept:
        if not self._in_idle[s] and self._ready[s] and self._accepting[s] and not self._corrupt[s]:
            self._in_idle[s] = 1
            self._idle[self._nidle] = s
            self._nidle += 1

    cdef int pick(self, int depth) except -2:
        """An idle slot (LIFO: the warmest worker), else, while tasks are short
        (depth > 1: prefetch), the accepting slot holding fewest under depth; -1.

        While tasks are short, an idle worker that last ran on the caller's CPU
        comes after an idle one elsewhere: a task pushed to it wakes it where it
        preempts the caller.  Never a busy worker while one is idle: a task queued
        behind one that blocks would wait while a worker idles."""
        cdef int s = -1, i, j, best = -1
        cdef uint32_t cpu
        cdef Py_ssize_t k, bestn = depth
        while self._nidle > 0:
            s = self._idle[self._nidle - 1]
            if self.accepts(s):
                break
            self._nidle -= 1
            self._in_idle[s] = 0
            s = -1
        if s >= 0:
            if depth > 1 and self._nidle > 1:
                cpu = fp_cpu_tag()
                if self._board.worker_on(s, cpu):
                    for j in range(self._nidle - 2, -1, -1):
                        i = self._idle[j]
                        if self.accepts(i) and not self._board.worker_on(i, cpu):
                            s = i
                            break
            self._take_idle(s)
            return s
        if depth <= 1:
            return -1
        for i in range(self._n):
            if self.accepts(i):
                k = len(self._held[i])
                if k < bestn:
                    best, bestn = i, k
        return best

    cdef void _take_idle(self, int s) noexcept:
        # s leaves the idle stack, if it is there: a task is on its way to it
        cdef int j, k
        if not self._in_idle[s]:
            return
        self._in_idle[s] = 0
        for j in range(self._nidle - 1, -1, -1):  # the top, mostly
            if self._idle[j] == s:
                self._nidle -= 1
                for k in range(j, self._nidle):  # the others keep their order (warmest on top)
                    self._idle[k] = self._idle[k + 1]
                return

    cdef int push(self, int s, Task task) except? -1:
        """The task's record onto slot s's ring (its function's pickle the first
        time this worker sees it); on FP_OK the slot holds the task."""
        cdef Fn f = task.fn
        cdef bint send_fn = f.known[s] != self._gen[s]
        cdef Py_ssize_t flen = PyBytes_GET_SIZE(f.data) if send_fn else 0
        cdef uint64_t aux = fp_aux_call(f.id, flen, self._flush[s])
        cdef int rc = self._board.push_task(s, task.kind, wire_of(task), aux,
                                            PyBytes_AS_STRING(f.data), flen,
                                            PyBytes_AS_STRING(task.args),
                                            PyBytes_GET_SIZE(task.args))
        if rc == FP_OK:
            if send_fn:
                f.known[s] = self._gen[s]
            self._flush[s] = 0
            task.slot = s
            self._held[s].append(task)
        return rc

    cdef Py_ssize_t held(self, int s) except -1:
        return len(self._held[s])

    cdef bint readable(self, int s) noexcept:
        return not self._corrupt[s]

    cdef void forget_functions(self) noexcept:
        """The function registry was reset: each worker forgets its functions with
        the next record it gets, and nobody holds any function now."""
        cdef int s
        for s in range(self._n):
            self._flush[s] = 1
            self._gen[s] += 1

    cdef int cancel_held(self, int s, Task task, bint force) except -1:
        """Cancels a task slot s holds: HELD_SKIPPED if it will never run (it keeps its
        place in the slot; its SKIPPED reply, or a result that beat the request, is
        matched later and dropped), else it runs: HELD_KILL when force (the caller
        kills the worker), HELD_FLAGGED once its cooperative flag is set."""
        # The worker checks its skip words before it starts a task (Dekker with
        # fp_slot_start): either it sees this request, or we see it running.
        cdef uint64_t seq = self._skip_seq[s]
        self._skip_seq[s] += 1
        if self._board.skip_task(s, seq, wire_of(task)):
            return HELD_SKIPPED
        if force:
            return HELD_KILL
        self._board.request_cancel(s, wire_of(task))
        return HELD_FLAGGED

    # ---- replies -------------------------------------------------------------------

    cdef int ready(self, int s, uint64_t pid, list events) except -1:
        if not self._ready[s]:
            self._ready[s] = 1
            if not self._held[s]:
                self.to_idle(s)
            events.append(SlotEvent(_READY, s, pid))
        return 0

    cdef Task match(self, int s, uint64_t wire):
        """The task slot s holds under this wire id, taken off the slot (a reply
        came for it); None when the reply is for no task the slot holds."""
        cdef Task t
        q = self._held[s]
        if not q:
            return None
        t = q[0]
        if wire_of(t) == wire:
            return q.popleft()
        for t in q:
            if wire_of(t) == wire:
                q.remove(t)
                return t
        return None

    cdef int replied(self, int s, bint served, list events) except -1:
        """After a matched reply: the served count (served: it ran, not skipped),
        max_tasks_per_worker, the first reply, and idle again or time to retire."""
        if served:
            self._served[s] += 1
            if self._max_tasks and self._served[s] >= self._max_tasks:
                self._accepting[s] = 0
        if not self._answered[s]:
            self._answered[s] = 1
            events.append(SlotEvent(_FIRST_REPLY, s))
        if not self._held[s]:
            if self._accepting[s]:
                self.to_idle(s)
            elif self._ready[s]:
                events.append(SlotEvent(_RETIRE, s))
        return 0

    cdef int mark_corrupt(self, int s, str what, list events) except -1:
        """The slot broke its rings' format: it takes and gives nothing more, and
        supervision hears of it once."""
        if not self._corrupt[s]:
            self._corrupt[s] = 1
            self._ready[s] = 0
            events.append(SlotEvent(Happened.CORRUPT, s, what))
        return 0

    cdef int read(self, int s, list settle, list discard, list events, Ledger ledger,
                  Py_ssize_t budget) except -1:
        """Reads up to budget records (all: -1) from slot s's result ring.  Each reply
        is matched to the exact attempt the slot holds: the task gets its reply and
        goes to settle (its latency to the ledger); a reply nobody waits for goes
        to discard as (payload, handoff source).  Returns the records read."""
        cdef fp_recv_t rec
        cdef int rc, k = 0
        cdef uint32_t kind
        cdef uint64_t wire
        cdef Task task
        cdef Board board = self._board
        while budget < 0 or k < budget:
            rc = board.peek_result(s, &rec)
            if rc == FP_AGAIN:
                break
            if rc != FP_OK:
                self.mark_corrupt(s, "its result ring holds a record that breaks the format "
                                     "(a position or a length out of bounds)", events)
                break
            kind, wire = rec.kind, rec.task_id
            payload = PyBytes_FromStringAndSize(<const char *>rec.payload, rec.len) if rec.len \
                else None
            board.release_result(s, rec.next)
            k += 1
            if kind == FP_R_READY:
                self.ready(s, rec.aux, events)
                continue
            if kind == FP_R_INIT_FAILED:
                events.append(SlotEvent(_INIT_FAILED, s, payload))
                continue
            if (kind != FP_R_OK and kind != FP_R_ERR and kind != FP_R_BAD_RESULT
                    and kind != FP_R_SKIPPED):
                self.mark_corrupt(s, f"its result ring holds a record of unknown kind {kind}",
                                  events)
                break
            task = self.match(s, wire)
            if task is None:  # not a task this slot holds (late, or never ours): drop it
                ledger.add(C_UNKNOWN, 1)
                if kind == FP_R_OK and payload is not None:
                    discard.append((payload, s + 1 if rec.aux & FP_AUX_HANDOFFS else 0))
                continue
            if kind == FP_R_SKIPPED and not task.cancel_requested and not task.settled:
                # Nobody asked to drop it: the worker's skip words were overwritten.
                task.rkind, task.payload = FP_R_ERR, None
                settle.append(task)
                self.mark_corrupt(s, f"it skipped task {task.id}, which nobody cancelled", events)
                break
            self.replied(s, kind != FP_R_SKIPPED, events)
            if task.settled:  # cancelled while its worker held it: counted then
                if kind == FP_R_OK and payload is not None:
                    discard.append((payload, s + 1 if rec.aux & FP_AUX_HANDOFFS else 0))
                continue
            task.rkind = kind
            task.payload = payload
            task.run_ns = rec.aux & ~FP_AUX_HANDOFFS
            task.handoff_src = s + 1 if rec.aux & FP_AUX_HANDOFFS else 0
            if kind != FP_R_SKIPPED:
                ledger.sample(task.t_dispatch - task.t_submit, task.run_ns)
            settle.append(task)
        return k

    # ---- the lifecycle -------------------------------------------------------------

    cdef int spawned(self, int s, bytes init_payload, uint64_t req) except -1:
        """A new worker starts in slot s: its rings are emptied (the caller holds the
        dispatch lock, so no reader is inside them), its K_INIT record queued, and
        nothing is known about it yet."""
        self._board.reset_slot(s)
        if not self._board.push_control(s, FP_K_INIT, init_payload, req):
            raise errors.SegmentCorrupt(
                f"slot {s}: a freshly reset task ring refused the K_INIT record")
        self._gen[s] += 1
        self._served[s] = 0
        self._skip_seq[s] = 0
        self._answered[s] = 0
        self._corrupt[s] = 0
        self._ready[s] = 0
        self._accepting[s] = 1
        self._flush[s] = 0
        return 0

    cdef void stopping(self, int s) noexcept:
        self._ready[s] = 0

    cdef bint set_accepting(self, int s, bint accepting) except -1:
        """Retiring (False): no more tasks.  True if the slot holds nothing now."""
        self._accepting[s] = accepting
        idle = not self._held[s]
        if accepting and idle:
            self.to_idle(s)
        return idle

    cdef list take(self, int s):
        """Detaches every task slot s holds (ring order) and takes it out of dispatch."""
        cdef int i, k = 0
        q = self._held[s]
        tasks = list(q)
        q.clear()
        self._ready[s] = 0
        for i in range(self._nidle):
            if self._idle[i] != s:
                self._idle[k] = self._idle[i]
                k += 1
        self._nidle = k
        self._in_idle[s] = 0
        for t in tasks:
            (<Task>t).slot = -1
        return tasks

    cdef Task oldest(self, int s):
        """The first task slot s holds (ring order), or None."""
        q = self._held[s]
        return q[0] if q else None

    cdef Task task_on(self, int s, uint64_t wire):
        if wire == 0:
            return None
        for t in self._held[s]:
            if wire_of(<Task>t) == wire:
                return t
        return None

    cdef tuple view(self, int s):
        """(ready, accepting, served, held) for stats."""
        return (bool(self._ready[s]), bool(self._accepting[s]), self._served[s],
                len(self._held[s]))

    cdef void clear(self):
        for q in self._held:
            q.clear()
