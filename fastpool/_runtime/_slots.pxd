# The worker slots as the dispatcher sees them (fastpool/_runtime/_slots.pyx): one
# owner for every per-slot word; the dispatcher asks through these methods.
from libc.stdint cimport uint32_t, uint64_t

from fastpool._native._core cimport Board
from fastpool._runtime._task cimport Ledger, Task


# What a cancel of a task a slot holds came to (Slots.cancel_held).
cdef enum:
    HELD_SKIPPED = 1            # it will never run
    HELD_KILL = 2               # it runs; force: the caller kills the worker
    HELD_FLAGGED = 3            # it runs; its cooperative cancel flag is set


cdef class Slots:
    cdef Board _board
    cdef int _n
    cdef uint64_t _max_tasks
    cdef list _held                    # per slot: deque[Task] pushed to its ring, in ring order
    cdef int *_idle                    # LIFO stack of slots
    cdef int _nidle
    cdef char *_in_idle
    cdef char *_ready                  # the worker said READY and takes tasks
    cdef char *_accepting              # not retiring
    cdef char *_answered               # replied to a task since its spawn
    cdef char *_corrupt                # its rings broke their format: read nothing more
    cdef char *_flush                  # tell the worker to forget its functions
    cdef uint32_t *_gen                # spawn generation (Fn.known)
    cdef uint64_t *_served             # tasks answered since spawn
    cdef uint64_t *_skip_seq           # cancel-before-start requests sent

    # dispatch (dispatch lock held)
    cdef int pick(self, int depth) except -2
    cdef void _take_idle(self, int s) noexcept
    cdef bint accepts(self, int s) except -1
    cdef bint takes_pinned(self, int s) noexcept
    cdef void to_idle(self, int s) noexcept
    cdef int push(self, int s, Task task) except? -1
    cdef Py_ssize_t held(self, int s) except -1
    cdef bint readable(self, int s) noexcept
    cdef void forget_functions(self) noexcept
    cdef int cancel_held(self, int s, Task task, bint force) except -1
    # replies (dispatch lock held); events get SlotEvents for supervision
    cdef int ready(self, int s, uint64_t pid, list events) except -1
    cdef Task match(self, int s, uint64_t wire)
    cdef int replied(self, int s, bint served, list events) except -1
    cdef int mark_corrupt(self, int s, str what, list events) except -1
    cdef int read(self, int s, list settle, list discard, list events, Ledger ledger,
                  Py_ssize_t budget) except -1
    # the lifecycle (dispatch lock held)
    cdef int spawned(self, int s, bytes init_payload, uint64_t req) except -1
    cdef void stopping(self, int s) noexcept
    cdef bint set_accepting(self, int s, bint accepting) except -1
    cdef list take(self, int s)
    cdef Task oldest(self, int s)
    cdef Task task_on(self, int s, uint64_t wire)
    cdef tuple view(self, int s)
    cdef void clear(self)
