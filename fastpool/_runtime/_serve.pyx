# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A worker's serving loop, compiled: pop, decode, run, encode, push.

    task ring --> next_task (spin, then futex; GIL released)
                  start_task: slot.current := id, then the skip words
                  payload: [function pickle, the first time this worker sees it] + arguments
                  release the record
              --> run fn(*args) (a map chunk: fn over its items, in C)
              --> encode: None -> empty payload; plain values -> pickle; arrays -> descriptors
    result ring <-- put_result (waits for room), finish: current := 0, served += 1

The parent knows every task's function, options, timing and attempt; the
worker keeps nothing per task but the function cache (id -> function), so
the loop does no Python bookkeeping the parent already does.
"""

import inspect
import os
import pickle

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint32_t, uint64_t

from fastpool._runtime import _arrays, _call, _codec

from fastpool import errors
from fastpool._runtime._lazy import asyncio  # only a task returning a coroutine needs it

from fastpool._native._core cimport (
    FP_AUX_FLUSH, FP_AUX_FN_ID, FP_AUX_FN_LEN, FP_AUX_HANDOFFS, FP_K_CALL, FP_K_CALLKW,
    FP_K_STARCHUNK, FP_K_STOP, FP_K_TASK_LIMIT, FP_R_BAD_RESULT, FP_R_ERR, FP_R_OK, FP_R_SKIPPED,
    Board, fp_now_ns, fp_recv_t,
)
from fastpool._native._alloc cimport freed_bytes, owned_roots, peak_bytes, task_mark
from fastpool._native._sys cimport FP_AGAIN, FP_OK

cdef object _loads = pickle.loads
cdef object _dumps = pickle.dumps
cdef object _iscoroutine = inspect.iscoroutine

cdef int64_t RESULT_WAIT_NS = 3600 * 1000000000  # a parent reading nothing for an hour is gone
# An idle worker's wait doubles each empty slice up to this: it wakes only to see
# whether its template is gone (PR_SET_PDEATHSIG kills it with the template anyway).
cdef int64_t IDLE_SLICE_MAX_NS = 5 * 1000000000
# Idle pop slices after a task (0.1 s, then 0.2 s: they double) before the worker trims
# its arena region (gives back the pages of freed blocks beyond its warm reserve): a
# worker waiting for the next of a run of calls keeps its warm blocks, and what a batch
# left goes back within half a second (docs/arrays.md, "Memory that comes back").
TRIM_IDLE_SLICES = 2
# A task whose own arrays freed at least this much in the arena (its temporaries: not
# a result handed to the parent, which is still in use) has the worker trim at once,
# without waiting to idle, down to its warm reserve plus what the last TRIM_WINDOW tasks
# that took hook blocks needed at their peak.  So a run of alike tasks keeps its
# temporaries' pages warm (no page faults, no trims: glibc's dynamic mmap threshold does
# the same for repeated allocations up to 32 MiB), and what the recent tasks no longer
# use goes back before the next task, where glibc gives a large temporary back when it
# is freed.  Measured in docs/arrays.md ("Memory that comes back").
TRIM_CHURN_BYTES = 64 << 20
TRIM_WINDOW = 4
cdef enum:
    WINDOW = 4  # TRIM_WINDOW, as a C array's length

# Exit codes the parent reads as "why the worker left".
EXIT_STOPPED = 0
EXIT_RESULT_STUCK = 5
EXIT_TASK_RING_CORRUPT = 6
EXIT_ARENA_CORRUPT = 7


cdef bint _in_task = False  # inside a task's own region: its call and its result's encoding


def in_task():
    """Whether this worker's loop is inside a task's own region (its call, its result's
    encoding): the only place where the pool's SIGINT (Ctrl-C in the parent) is the
    task's to raise (fastpool/_runtime/_worker.py, _on_sigint)."""
    return _in_task


cdef inline bint _atomic(object x):
    t = type(x)
    return t is int or t is float or t is str or t is bytes or t is bool or t is complex


cdef inline int64_t _ns(double seconds) noexcept:
    return <int64_t>(seconds * 1e9) if seconds > 0 else 0


def serve(Board board, int slot, int parent_pid, double spin_s, double pop_slice_s):
    """Runs tasks from slot's ring until told to stop.

    Returns EXIT_STOPPED on K_STOP or when the parent process is gone,
    EXIT_RESULT_STUCK if a result found no room for an hour,
    EXIT_TASK_RING_CORRUPT if the task ring breaks its format, and
    EXIT_ARENA_CORRUPT after reporting that its arena region was written over (the
    parent then sees a death, judges it, repairs what it must and replaces it)."""
    global _in_task
    cdef dict fns = {}
    cdef fp_recv_t rec
    cdef int rc
    cdef uint32_t kind, rkind
    cdef uint64_t wire, aux, flen
    cdef int64_t t0, spin_ns = _ns(spin_s), slice_ns = _ns(pop_slice_s), spin = spin_ns
    cdef int64_t wait_ns = slice_ns
    cdef uint64_t flags
    cdef bint skipped, sent, trim_due = False
    cdef uint64_t freed0, live0, need, warm, churn_trim = TRIM_CHURN_BYTES
    cdef uint64_t needs[WINDOW]  # the hook bytes each of the last tasks took at its peak
    cdef int nneeds = 0, i
    cdef int idle = 0
    cdef const char *outp
    cdef Py_ssize_t outn
    cdef Py_ssize_t spill_at = board.max_record  # a larger result travels in the arena
    encode_exception = _codec.encode_exception
    encode_result = _codec.encode_result
    spill_result = _arrays.spill_result
    encode_bad_result = _codec.encode_bad_result
    run_chunk = _call.run_chunk
    while True:
        with nogil:
            rc = board.next_task(slot, &rec, wait_ns, spin)
        if rc == FP_AGAIN:
            spin = 0
            if os.getppid() != parent_pid:
                return EXIT_STOPPED
            idle += 1
            if trim_due and idle >= TRIM_IDLE_SLICES:
                # again at later slices while blocks of the region are live: the
                # parent may free a result (or the worker a kept array) later
                trim_due = _arrays.trim_process_arena()
            wait_ns = min(2 * wait_ns, IDLE_SLICE_MAX_NS)
            continue
        wait_ns = slice_ns
        if rc != FP_OK:
            return EXIT_TASK_RING_CORRUPT
        kind, wire, aux = rec.kind, rec.task_id, rec.aux
        if kind >= FP_K_TASK_LIMIT:
            board.release_task(slot, rec.next)
            if kind == FP_K_STOP:
                return EXIT_STOPPED
            continue
        skipped = board.start_task(slot, wire)  # before the record is consumed
        flen = FP_AUX_FN_LEN(aux)
        if flen > rec.len:
            flen = rec.len  # a malformed record fails below, as its task's error
        fn_data = PyBytes_FromStringAndSize(<const char *>rec.payload, flen) if flen else None
        arg_data = PyBytes_FromStringAndSize(<const char *>rec.payload + flen, rec.len - flen)
        board.release_task(slot, rec.next)
        if aux & FP_AUX_FLUSH:
            fns.clear()
        fid = FP_AUX_FN_ID(aux)
        if fn_data is not None:
            fns[fid] = fn_data  # unpickled on first use, so a bad pickle fails its own task
        if skipped:
            board.put_result(slot, FP_R_SKIPPED, wire, 0, NULL, 0, RESULT_WAIT_NS)
            board.finish(slot, False)
            continue
        t0 = fp_now_ns()
        freed0 = freed_bytes()
        live0 = task_mark()
        out = None
        rkind = FP_R_OK
        damaged = False
        flags = 0
        handed = None
        # A SIGINT that came between tasks is handled here, outside this one (the
        # worker's handler ignores it there), rather than raised in its body.
        PyErr_CheckSignals()
        try:
            _in_task = True
            fn = fns.get(fid)
            if fn is None:
                raise errors.SerializationError(
                    f"task {wire >> 3}", "its function never reached this worker (fastpool bug)")
            if type(fn) is bytes:
                fn = _codec.load_function(fn)
                fns[fid] = fn
            if kind == FP_K_CALL:
                result = fn(*_loads(arg_data)) if PyBytes_GET_SIZE(arg_data) else fn()
            elif kind == FP_K_CALLKW:
                args, kwargs = _loads(arg_data)
                result = fn(*args, **kwargs)
                args = kwargs = None
            else:
                result = run_chunk(fn, _loads(arg_data), kind == FP_K_STARCHUNK)
            arg_data = None  # drop this worker's views of the call's shared arrays before replying
            if _iscoroutine(result):
                result = asyncio.run(result)
            if result is not None:
                if _atomic(result):
                    out = _dumps(result, 5)
                if out is not None and PyBytes_GET_SIZE(out) <= spill_at:
                    pass
                else:
                    try:
                        # owned_roots first, while serve's local is the result's only holder
                        out, handed = (spill_result(out, spill_at) if out is not None else
                                       encode_result(result, owned_roots(result), spill_at))
                        if handed is not None:  # the parent can take them back whatever happens
                            flags = FP_AUX_HANDOFFS
                    except errors.SharedMemoryError as exc:  # the arena is full: say so, as itself
                        out, rkind = encode_exception(exc), FP_R_ERR
                    except errors.SegmentCorrupt as exc:  # its arena region was written over
                        out, rkind, damaged = encode_exception(exc), FP_R_ERR, True
                    # an unpicklable result fails only its future
                    except Exception as exc:  # noqa: BLE001
                        out, rkind = encode_bad_result(wire >> 3, exc, result), FP_R_BAD_RESULT
            result = None
            _in_task = False
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a task is the task's error
            _in_task = False
            result = arg_data = None
            out, rkind = encode_exception(exc), FP_R_ERR
        if out is None:
            outp, outn = NULL, 0
        else:
            outp, outn = PyBytes_AS_STRING(out), PyBytes_GET_SIZE(out)
        try:
            sent = board.put_result(
                slot, rkind, wire, (fp_now_ns() - t0) | flags, outp, outn, RESULT_WAIT_NS) == 1
        except Exception as exc:  # noqa: BLE001 - a result over the ring limit: say so instead
            if handed is not None:
                handed.release()
            flags = 0
            if isinstance(exc, errors.SerializationError):  # named by the id stats() shows
                exc = errors.SerializationError(f"the result of task {wire >> 3}", exc.reason)
            err = encode_exception(exc)
            sent = board.put_result(slot, FP_R_ERR, wire, fp_now_ns() - t0, PyBytes_AS_STRING(err),
                                    PyBytes_GET_SIZE(err), RESULT_WAIT_NS) == 1
        out = None
        board.finish(slot, True)
        if not sent:
            return EXIT_RESULT_STUCK
        if damaged:
            return EXIT_ARENA_CORRUPT  # the parent repairs the region before a replacement uses it
        spin = spin_ns
        idle, trim_due = 0, True
        need = peak_bytes() - live0
        if need:  # a task that took no hook block leaves the window as it was
            needs[nneeds % WINDOW] = need
            nneeds += 1
        if freed_bytes() - freed0 >= churn_trim:
            warm = 0
            for i in range(min(nneeds, WINDOW)):
                warm = max(warm, needs[i])
            trim_due = _arrays.trim_process_arena(warm)
