"""Worker process entry: attach the board, replay the initializer, then serve.

    template fork -> main(board_fd, slot)
        attach board (and arena); slot.state = STARTING, slot.pid
        heartbeat thread: slot.heartbeat += 1 every HEARTBEAT_INTERVAL_S (needs the GIL,
                          so a worker wedged in C code holding the GIL stops beating)
        pop K_INIT: run initializer(*initargs); failure -> R_INIT_FAILED, exit 3
        slot.state = READY; push R_READY
        _serve.serve(): the compiled task loop, until K_STOP or the parent is gone

Only workers import this module; the parent shares nothing with it but the
board's format and fastpool._runtime._call.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from fastpool._runtime import _arrays, _call, _codec, _mainns
from fastpool._runtime._codec import R_INIT_FAILED, R_READY

HEARTBEAT_INTERVAL_S = 0.05
POP_SLICE_S = 0.1
SPIN_AFTER_TASK_S = float(os.environ.get("FASTPOOL_WORKER_SPIN_US", "60")) * 1e-6
INIT_WAIT_S = 120.0

EXIT_NO_INIT = 4
EXIT_INIT_FAILED = 3


def _heartbeat(board: Any, slot: int, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_INTERVAL_S):
        board.beat(slot)


def main(board_fd: int, slot: int, env: dict, arena_fd: int = -1, req: int = 0) -> int:
    from fastpool._native._core import SLOT_READY, SLOT_STARTING, Board
    from fastpool._runtime import _serve

    # The template ignores SIGINT (Ctrl-C in the terminal is the parent's); a worker
    # takes it back, so a pool interrupted by Ctrl-C can interrupt the tasks it runs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    board = Board.attach(board_fd)
    os.close(board_fd)
    if arena_fd >= 0:  # before K_INIT: initargs may hold shared arrays
        from fastpool._native._arena import Arena

        _arrays.set_process_arena(Arena.attach(arena_fd, slot + 1))
        os.close(arena_fd)
    pid = os.getpid()
    _look_like_a_child(slot)
    board.set_state(slot, SLOT_STARTING, pid)
    _call.CURRENT["board"], _call.CURRENT["slot"] = board, slot
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat, args=(board, slot, stop), name="fastpool-heartbeat", daemon=True
    )
    beat.start()
    parent = os.getppid()

    # Only the K_INIT of our own spawn request: a worker forked for a request its
    # slot gave up on (a start that timed out) must not take a successor's record.
    rec = board.pop_init(slot, req, INIT_WAIT_S)
    if rec is None:
        return EXIT_NO_INIT
    try:
        initializer, initargs, blas_threads = _codec.loads(rec)
        if blas_threads and blas_threads > 1:
            _set_blas_threads(blas_threads)
        if initializer is not None:
            fn = _codec.loads(initializer) if isinstance(initializer, bytes) else initializer
            _mainns.run_initializer(fn, initargs, _call.run)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in an initializer is a failure too
        board.push_result(slot, R_INIT_FAILED, 0, 0, _codec.encode_exception(exc), 5.0)
        return EXIT_INIT_FAILED
    del rec, initargs
    board.set_state(slot, SLOT_READY)
    board.push_result(slot, R_READY, 0, pid, b"", 5.0)
    code = _serve.serve(board, slot, parent, SPIN_AFTER_TASK_S, POP_SLICE_S)
    stop.set()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _look_like_a_child(slot: int) -> None:
    """Makes multiprocessing see this worker as the pool owner's child process, as a
    ProcessPoolExecutor worker is: ``current_process().name`` is ``fastpool-worker-N`` and
    ``parent_process()`` names the owner (the template's parent), so code that refuses to
    start a pool inside a worker recognises one."""
    import multiprocessing.process as mpp

    template = os.getppid()
    owner = template
    try:
        with open(f"/proc/{template}/stat", "rb") as f:  # the template's own parent
            owner = int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    proc = mpp.current_process()
    authkey = os.environ.pop("FASTPOOL_AUTHKEY", None)
    if authkey:
        proc.authkey = bytes.fromhex(authkey)
    proc.name = f"fastpool-worker-{slot}"
    proc._identity = (slot + 1,)
    proc._parent_pid, proc._parent_name = owner, "MainProcess"
    try:
        sentinel = os.pidfd_open(owner)  # readable once the owner exits: is_alive(), join()
    except (OSError, AttributeError):
        return
    os.set_inheritable(sentinel, False)
    mpp._parent_process = mpp._ParentProcess("MainProcess", owner, sentinel)


def _set_blas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n)
