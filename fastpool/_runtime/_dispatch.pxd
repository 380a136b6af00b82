# The dispatcher's declarations (fastpool/_runtime/_dispatch.pyx): its state is its
# own; only its subclass, _controls.Dispatcher, cimports it.  Slots own the per-slot
# words (_slots.pxd).
from libc.stdint cimport int64_t
from cpython.pythread cimport PyThread_type_lock

from fastpool._native._core cimport Board
from fastpool._runtime._slots cimport Slots
from fastpool._runtime._task cimport Fn, Ledger, Registry, Task


cdef class DispatchCore:
    cdef Board board
    cdef readonly int nslots
    cdef Slots _slots
    cdef Registry _fns
    cdef Ledger _ledger
    cdef PyThread_type_lock _lock      # the state below; never held while Python code may block
    cdef PyThread_type_lock _drive     # one consumer of the result rings at a time
    cdef unsigned long _driver         # thread ident of the holder of _drive, 0 if none
    cdef object _queue                 # deque[Task]: FIFO
    cdef list _pinned                  # per slot: deque[Task] addressed to it, not pushed yet
    cdef Py_ssize_t _npinned           # the tasks in _pinned
    cdef dict _inflight                # task id -> Task: accepted and not settled
    cdef readonly Py_ssize_t max_queue
    cdef bint _reject
    cdef double _queue_timeout
    cdef bint _closed
    cdef bint _paused
    cdef bint _circuit_open
    cdef readonly bint torn_down
    cdef object _arena
    cdef object _hooks
    cdef object _fcond                 # the futures' shared condition (an RLock inside)
    cdef object _flock                 # its lock
    cdef object _progress              # Condition: a driver settled something
    cdef list _pending                 # SlotEvents seen under the lock, told after it
    cdef list _discard                 # (payload, handoff src) of replies nobody reads
    cdef int _fg_waiting
    cdef int64_t _last_fg
    cdef unsigned long long _drives_ended  # drives that ended: one long drive leaves it still
    cdef bint _napping                 # the collector sleeps through one long drive
    cdef object _handoff               # the collector's Event (collector_loop's handoff)
    cdef int _next_poll
    cdef public bint idle_watch         # supervision sleeps: the next accepted task wakes it

    cdef int _acquire(self) except -1
    cdef void _release(self) noexcept
    cdef Fn _fn(self, object fn, bint chunk)
    cdef Fn _encode_call(self, Task task, object fn, tuple args, dict kwargs)
    cdef object _submit_task(self, Task task, Fn f, object options, Py_ssize_t items, bint wait)
    cdef object _enqueue(self, Task task, bint wait)
    cdef int _collect_if_free(self) except -2
    cdef int _dispatch_locked(self) except -1
    cdef int _push_pinned(self) except -1
    cdef list _take_pinned(self, int s)
    cdef bint _unqueue(self, Task task) except -1
    cdef int collect(self) except -1
    cdef int _read_slot(self, int s, list settle, Py_ssize_t budget) except -1
    cdef int _settle(self, Task task, int outcome, object value, object exc,
                     list later=*) except -1
    cdef int _run_events(self) except -1
    cdef bint _ok(self, object fut, object pred) except -1
    cdef object _drive_until(self, object fut, object pred, object timeout)
    cdef bint _drive_held(self, object fut, object pred, double deadline) except -1
