# A task, its function entry and its future: what the dispatcher moves and settles.
from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef class Fn:
    """A function as the pool sends it: an id per pool, its pickle, and for
    each slot the generation of the worker that already holds it."""
    cdef readonly uint32_t id
    cdef readonly bytes data
    cdef readonly str name
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
    cdef public int64_t t_submit
    cdef public int64_t t_dispatch
    cdef public int64_t run_ns
    cdef public bint cancel_requested
    cdef public bint settled
    cdef public uint32_t rkind         # the reply's kind and payload, between read and settle
    cdef public object payload
    cdef public int handoff_src        # the worker process whose handoffs the payload lists (0: none)


cdef inline uint64_t wire_of(Task t) noexcept:
    return (t.id << 3) | t.attempt


cdef bint is_done(object fut) except -1
cdef object new_future(object disp, object fcond, Task task)
cdef int settle_future(Task task, object flock, object fcond, object value, object exc, bint cancelled) except -1
cdef int notify_cancelled(object fut) except -1
