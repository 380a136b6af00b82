"""Worker process entry: attach the board, replay the initializer, serve tasks.

    template fork -> main(board_fd, slot)
        attach board; slot.state = STARTING, slot.pid
        heartbeat thread: slot.heartbeat += 1 every HEARTBEAT_INTERVAL_S (needs the GIL,
                          so a worker wedged in C code holding the GIL stops beating)
        pop K_INIT: run initializer(*initargs); failure -> R_INIT_FAILED, exit 3
        slot.state = READY; push R_READY
        loop: pop task (slot.current is set before the record is consumed)
              run it; push R_OK / R_ERR / R_BAD_RESULT with the run time in aux
              slot.current = 0
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from typing import Any

from fastpool import _codec, errors
from fastpool._lazy import asyncio  # only a task returning a coroutine needs it (~10 ms to import)
from fastpool._codec import K_CALL, K_INIT, K_STOP, R_BAD_RESULT, R_ERR, R_INIT_FAILED, R_OK, R_READY

HEARTBEAT_INTERVAL_S = 0.05
POP_SLICE_S = 0.1
SPIN_AFTER_TASK_S = float(os.environ.get("FASTPOOL_WORKER_SPIN_US", "60")) * 1e-6
INIT_WAIT_S = 120.0

_state = threading.local()
_CURRENT: dict[str, Any] = {"board": None, "slot": -1}


def cancelled() -> bool:
    """True inside a task whose cancellation was requested (cooperative cancel).

    Long tasks poll it and return early; outside a worker it is always False."""
    board = _CURRENT["board"]
    return board is not None and board.cancel_requested(_CURRENT["slot"])


def _heartbeat(board: Any, slot: int, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_INTERVAL_S):
        board.beat(slot)


def _run(fn: Any, args: tuple, kwargs: dict) -> Any:
    result = fn(*args, **kwargs)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return result


def run_chunk(fn_bytes: bytes, items: list, star: bool) -> Any:
    """Runs fn over a map chunk.  Returns the results, or a ChunkFailure holding what
    succeeded and the encoded exception, so map can yield up to the failing item."""
    fn = _load_fn(fn_bytes)
    out: list = []
    append = out.append
    try:
        if star:
            for item in items:
                append(fn(*item))
        else:
            for item in items:
                append(fn(item))
        if out and inspect.iscoroutine(out[0]):
            out = [asyncio.run(c) if inspect.iscoroutine(c) else c for c in out]
    except Exception as exc:  # noqa: BLE001 - reported on the map's channel
        return ChunkFailure(out, _codec.encode_exception(exc))
    return out


class ChunkFailure:
    __slots__ = ("results", "exc_payload")

    def __init__(self, results: list, exc_payload: bytes) -> None:
        self.results = results
        self.exc_payload = exc_payload

    def __reduce__(self) -> Any:
        return (ChunkFailure, (self.results, self.exc_payload))


_FN_CACHE: dict[bytes, Any] = {}


def _load_fn(fn_bytes: bytes) -> Any:
    fn = _FN_CACHE.get(fn_bytes)
    if fn is None:
        fn = _codec.loads(fn_bytes)
        if len(_FN_CACHE) > 512:
            _FN_CACHE.clear()
        _FN_CACHE[fn_bytes] = fn
    return fn


def main(board_fd: int, slot: int, env: dict, arena_fd: int = -1) -> int:
    from fastpool._core import SLOT_READY, SLOT_STARTING, Board

    board = Board.attach(board_fd)
    os.close(board_fd)
    if arena_fd >= 0:  # before K_INIT: initargs may hold shared arrays
        from fastpool._arena import Arena

        _codec.set_process_arena(Arena.attach(arena_fd, slot + 1))
        os.close(arena_fd)
    pid = os.getpid()
    board.set_state(slot, SLOT_STARTING, pid)
    _CURRENT["board"], _CURRENT["slot"] = board, slot
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(board, slot, stop), name="fastpool-heartbeat", daemon=True)
    beat.start()
    parent = os.getppid()

    rec = board.pop_task(slot, INIT_WAIT_S)
    if rec is None or rec[0] != K_INIT:
        return 4
    try:
        initializer, initargs, blas_threads = _codec.loads(rec[2])
        if blas_threads and blas_threads > 1:
            _set_blas_threads(blas_threads)
        if initializer is not None:
            _run(_codec.loads(initializer) if isinstance(initializer, bytes) else initializer, initargs, {})
    except BaseException as exc:  # noqa: BLE001 - SystemExit in an initializer is a failure too
        board.push_result(slot, R_INIT_FAILED, 0, 0, _codec.encode_exception(exc), 5.0)
        return 3
    board.set_state(slot, SLOT_READY)
    board.push_result(slot, R_READY, 0, pid, b"", 5.0)

    dumps, loads, load_fn, encode_exception = _codec.encode_result, _codec.loads, _load_fn, _codec.encode_exception
    perf = time.perf_counter_ns
    spin = SPIN_AFTER_TASK_S
    while True:
        rec = board.pop_task(slot, POP_SLICE_S, spin)
        if rec is None:
            spin = 0.0
            if os.getppid() != parent:
                return 0
            continue
        kind, task_id, payload = rec
        if kind == K_STOP:
            break
        if kind != K_CALL:
            continue
        t0 = perf()
        try:
            fn_bytes, args, kwargs = loads(payload)
            result = _run(load_fn(fn_bytes), args, kwargs)
            try:
                out = dumps(result)
                rkind = R_OK
            except errors.SharedMemoryError as exc:  # the arena is full: say so, as itself
                out = encode_exception(exc)
                rkind = R_ERR
            except Exception as exc:  # noqa: BLE001 - an unpicklable result fails only its future
                out = _codec.encode_bad_result(task_id, exc, result)
                rkind = R_BAD_RESULT
            del result
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a task is the task's error
            out = encode_exception(exc)
            rkind = R_ERR
        args = kwargs = None  # drop this worker's views of the call's shared arrays before replying
        try:
            sent = board.push_result(slot, rkind, task_id, perf() - t0, out)
        except Exception as exc:  # noqa: BLE001 - e.g. a result over the ring limit
            sent = board.push_result(slot, R_ERR, task_id, perf() - t0, encode_exception(exc))
        board.finish_task(slot)
        if not sent:
            return 5
        spin = SPIN_AFTER_TASK_S
    stop.set()
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def _set_blas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n)
