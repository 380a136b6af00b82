# A task, its function entry and its future: what the dispatcher moves and settles,
# the registry of functions, and the ledger of how tasks ended.
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef class Fn:
    """A function as the pool sends it: an id per pool, its pickle, and for
    each slot the generation of the worker that already holds it."""
    cdef readonly uint32_t id
    cdef readonly bytes data
    cdef readonly str name
    cdef readonly bint rides           # it rides in each call (_call.ride): data is ride's
    cdef uint32_t *known


cdef class Task:
    cdef readonly uint64_t id
    cdef public uint32_t attempt       # 0, then 1 after a crash retry: part of the wire id
    cdef public uint32_t kind
    cdef public object future          # None once settled (the future -> task -> future cycle ends)
    cdef public Fn fn
    cdef public bytes args             # the pickled arguments (the payload after the function)
    cdef public object options         # _policy.TaskOptions or None
    cdef public object keep            # shared blocks the call names, pinned until it settles
    cdef public bint transferred       # the call carried fastpool.transfer()ed buffers
    cdef public Py_ssize_t items       # map items in a chunk (0 for a call)
    cdef public int slot               # -1 while queued
    cdef public int pin                # slot + 1 of a call addressed to one worker slot; 0: any
    cdef public int64_t t_submit
    cdef public int64_t t_dispatch
    cdef public int64_t run_ns
    cdef public bint cancel_requested
    cdef public bint settled
    cdef public uint32_t rkind         # the reply's kind and payload, between read and settle
    cdef public object payload
    cdef public int handoff_src        # the worker whose handoffs the payload lists (0: none)
    cdef public object arg_facts       # what the arguments were, taken at submit (crash records)


# How a task ends: the one settle function (Dispatcher._settle) takes one of these.
cdef enum:
    END_DONE = 1                # a value
    END_FAILED = 2              # an exception
    END_CANCELLED = 3
    END_REPLY = 4               # the worker's reply (task.rkind, task.payload), decoded there
    END_INLINE = 5              # run the call in this process (fallback="inline") first

cdef enum:
    SAMPLES = 8192              # latency samples kept (a ring)
    MAX_PREFETCH = 16

# Counters: the dispatcher's own events (supervision keeps its own); names in COUNTER_NAMES.
cdef enum:
    C_SUBMITTED, C_COMPLETED, C_FAILED, C_CANCELLED
    C_CHUNKS, C_CHUNKS_COMPLETED, C_CHUNKS_FAILED, C_CHUNKS_CANCELLED, C_ITEMS
    C_UNKNOWN, C_BAD_RESULTS, C_RETRIED, C_INLINE, COUNTER_COUNT


cdef class Registry:
    """The functions a pool has sent: an Fn per distinct pickle."""
    cdef int _nslots
    cdef dict _by_obj                  # by-reference functions -> Fn
    cdef dict _by_data                 # pickle -> Fn
    cdef dict _riders                  # (name, chunk) -> the Fn of a function that rides
    cdef uint32_t _next
    cdef Py_ssize_t _bytes             # the registry's pickles, in bytes
    cdef public Py_ssize_t ride_bytes  # a function whose pickle is this large rides in its calls
    cdef Fn get(self, object fn, bint chunk, bint *reset)
    cdef Fn _entry(self, bytes data, str name, bint *reset)


cdef class Ledger:
    """What happened to tasks: counters and latency samples."""
    cdef long long *_counts
    cdef int64_t *_waits
    cdef int64_t *_runs
    cdef uint64_t _n
    cdef double _ewma_run_ns
    cdef int _prefetch
    cdef void add(self, int counter, long long n) noexcept
    cdef int prefetch(self) noexcept
    cdef int ended(self, Task task, int outcome, object value) except -1
    cdef void sample(self, int64_t wait_ns, int64_t run_ns) noexcept


cdef inline uint64_t wire_of(Task t) noexcept:
    return (t.id << 3) | t.attempt


cdef bint is_done(object fut) except -1
cdef object new_future(object disp, object fcond, Task task)
cdef int settle_future(object fut, object flock, object fcond, object value, object exc,
                      bint cancelled, list later) except -1
cdef int run_callbacks(list futs) except -1
cdef int encode_call(Task task, tuple args, dict kwargs, object arena, object memo=*) except -1
cdef int encode_chunk(Task task, object items, bint star, object arena, object memo) except -1
cdef tuple decode_reply(Task task, object arena)
cdef int drop_result(bytes payload, object arena, int src) except -1
