# The dispatcher's contract for other extensions (_control extends it): the
# Dispatch class's C-level state (the seed's four parts: FIFO queue, LIFO
# idle stack, in-flight map, per-slot assignment map).
from libc.stdint cimport int64_t, uint32_t, uint64_t
from cpython.pythread cimport PyThread_type_lock

from fastpool._native._core cimport Board
from fastpool._runtime._task cimport Fn, Task


cdef enum:
    SAMPLES = 8192              # latency samples kept (a ring)

# Counters: the dispatcher's own events (supervision keeps its own); names in COUNTER_NAMES.
cdef enum:
    C_SUBMITTED, C_COMPLETED, C_FAILED, C_CANCELLED
    C_CHUNKS, C_CHUNKS_COMPLETED, C_CHUNKS_FAILED, C_CHUNKS_CANCELLED, C_ITEMS
    C_UNKNOWN, C_BAD_RESULTS, C_RETRIED, COUNTER_COUNT


cdef class Dispatch:
    cdef Board board
    cdef readonly int nslots
    cdef PyThread_type_lock _lock      # the dispatch state below; never held while Python code may block
    cdef PyThread_type_lock _drive     # one consumer of the result rings at a time
    cdef unsigned long _driver         # thread ident of the holder of _drive, 0 if none
    cdef object _queue                 # deque[Task]: FIFO
    cdef int *_idle                    # LIFO stack of slots
    cdef int _nidle
    cdef char *_in_idle
    cdef dict _inflight                # task id -> Task: accepted and not settled
    cdef list _assigned                # per slot: deque[Task] pushed to its ring, in ring order
    cdef char *_ready                  # the worker said READY and takes tasks
    cdef char *_accepting              # not retiring
    cdef char *_answered               # replied to a task since its spawn
    cdef char *_corrupt                # its rings broke their format: read nothing more
    cdef uint32_t *_gen                # spawn generation per slot (Fn.known)
    cdef uint64_t *_served             # tasks answered since spawn
    cdef uint64_t *_skip_seq           # cancel-before-start requests sent, per slot
    cdef readonly Py_ssize_t max_queue
    cdef bint _reject
    cdef double _queue_timeout
    cdef uint64_t _max_tasks
    cdef readonly int depth            # prefetch: tasks a worker may hold
    cdef double _ewma_run_ns
    cdef bint _closed
    cdef bint _paused
    cdef bint _circuit_open
    cdef readonly bint torn_down
    cdef dict _fns_by_obj              # by-reference functions -> Fn
    cdef dict _fns_by_data             # pickle -> Fn
    cdef uint32_t _next_fn
    cdef Py_ssize_t _fn_bytes          # the registry's pickles, in bytes
    cdef char *_flush                  # per slot: tell the worker to forget its functions
    cdef object _arena
    cdef object _hooks
    cdef object _fcond                 # the futures' shared condition (an RLock inside)
    cdef object _flock                 # its lock
    cdef object _progress              # Condition: a driver settled something
    cdef list _pending                 # hook events seen under the lock, run after it
    cdef list _discard                 # (payload, handoff src) of replies nobody reads: decoded (to unpin blocks), dropped
    cdef int _fg_waiting
    cdef int64_t _last_fg
    cdef int _next_poll
    cdef long long *_counts
    cdef int64_t *_wait_samples
    cdef int64_t *_run_samples
    cdef uint64_t _nsamples

    cdef int _acquire(self) except -1
    cdef int _collect_if_free(self) except -1
    cdef object _submit_task(self, Task task, Fn f, object options, Py_ssize_t items, bint wait)
    cdef int _drop_locked(self, Task task) except -1
    cdef int _mark_corrupt(self, int s, str what) except -1
    cdef int _sample(self, Task task, int64_t run_ns) except -1
    cdef int _count_failed_ok(self, Task task, Py_ssize_t done) except -1
    cdef int _drop_result(self, bytes payload, int src) except -1
    cdef int _run_events(self) except -1
    cdef bint _ok(self, object fut, object pred) except -1
    cdef object _drive_until(self, object fut, object pred, object timeout)
    cdef void _release(self) noexcept
    cdef Fn _fn(self, object fn)
    cdef object _enqueue(self, Task task, bint wait)
    cdef int _pick(self) except -2
    cdef bint _accepts(self, int s) except -1
    cdef void _to_idle(self, int s) noexcept
    cdef int _push(self, int s, Task task) noexcept
    cdef int _dispatch_locked(self) except -1
    cdef int _read_slot(self, int s, list settle, list events, Py_ssize_t budget) except -1
    cdef int _settle(self, Task task) except -1
    cdef int _finish(self, Task task, object value, object exc, bint cancelled) except -1
    cdef int collect(self) except -1
    cdef bint _drive_held(self, object fut, object pred, double deadline) except -1
