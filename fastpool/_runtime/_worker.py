"""Worker process entry: attach the board, replay the initializer, then serve.

    template fork -> main(board_fd, slot)
        attach board (and arena); slot.state = STARTING, slot.pid
        pop K_INIT: initializer, initargs, blas threads, the pool's hang_timeout
        heartbeat thread: slot.heartbeat += 1 every beat_interval(hang_timeout) (needs the
                          GIL, so a worker wedged in C code holding the GIL stops beating)
        run initializer(*initargs); failure -> R_INIT_FAILED, exit 3
        slot.state = READY; push R_READY
        _serve.serve(): the compiled task loop, until K_STOP or the parent is gone

Only workers import this module; the parent shares nothing with it but the
board's format and fastpool._runtime._call.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from typing import Any, Callable

from fastpool._runtime import _arrays, _call, _codec, _mainns
from fastpool._runtime._codec import R_INIT_FAILED, R_READY

# A beat needs the GIL: the running task's thread hands it over and back, and the
# beating thread's wake preempts a busy CPU (~20 wakes a second per worker at 0.05 s,
# measured on a map of 50 ms tasks).  So the pool's hang_timeout sets the pace: a
# twentieth of it, between these bounds (0.25 s for the default 60 s).  The upper bound
# is what an idle pool pays: a beat that finds its worker idle puts the thread to sleep,
# so it sleeps within one beat of the last task (at 1 s, an idle pool of 16 read 5.7
# ms/s of CPU in the bench's idle row, against 3.0 with 0.05 s beats).
HEARTBEAT_MIN_S = 0.05
HEARTBEAT_MAX_S = 0.25
BEAT_IDLE_S = 0.1  # idle this long (whole beats, at least one) before the heartbeat sleeps
BEAT_PARK_S = 60.0  # the bound on that sleep; the worker's next task ends it at once
POP_SLICE_S = 0.1
SPIN_AFTER_TASK_S = float(os.environ.get("FASTPOOL_WORKER_SPIN_US", "60")) * 1e-6
INIT_WAIT_S = 120.0

EXIT_NO_INIT = 4
EXIT_INIT_FAILED = 3


def beat_interval(hang_timeout: float | None) -> float:
    """Seconds between a busy worker's beats for the pool's ``hang_timeout``: a twentieth of
    it within [HEARTBEAT_MIN_S, HEARTBEAT_MAX_S], so the parent (which reads beats every
    0.1 s) sees a live worker beat many times in every ``hang_timeout``.  None (no hang
    detection): the slowest pace."""
    if not hang_timeout:
        return HEARTBEAT_MAX_S
    return min(HEARTBEAT_MAX_S, max(HEARTBEAT_MIN_S, hang_timeout / 20))


def _heartbeat(board: Any, slot: int, stop: threading.Event, interval: float) -> None:
    # The parent reads heartbeats only while this worker holds a task, so an idle
    # worker's thread sleeps until the next task starts (fp_slot_start wakes it);
    # after BEAT_IDLE_S of idling, so that back-to-back short tasks never pay the wake
    # (one futex wake on the worker's path to its next task).  It was 1 s: 20 beats of
    # every idle worker after each batch, ~1.5-2 ms of CPU per worker in that second.
    idle, seen = 0, -1
    idle_beats = max(1, round(BEAT_IDLE_S / interval))
    while not stop.wait(interval):
        board.beat(slot)
        _, _, cur, _, served = board.slot_info(slot)
        # short beats count idle ones from the last task served; a beat as long as
        # BEAT_IDLE_S that finds no task running is idle enough on its own
        if cur or (served != seen and idle_beats > 1):
            idle, seen = 0, served
            continue
        seen = served
        idle += 1
        if idle >= idle_beats:
            board.park_beat(slot, served, BEAT_PARK_S)
            idle = 0


def main(board_fd: int, slot: int, env: dict, arena_fd: int = -1, req: int = 0) -> int:
    from fastpool._native._core import SLOT_READY, SLOT_STARTING, Board
    from fastpool._runtime import _serve

    # The template ignores SIGINT (Ctrl-C in the terminal is the parent's); a worker
    # takes it back, so a pool interrupted by Ctrl-C can interrupt the tasks it runs.
    signal.signal(signal.SIGINT, _on_sigint)
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
    parent = os.getppid()

    # Only the K_INIT of our own spawn request: a worker forked for a request its
    # slot gave up on (a start that timed out) must not take a successor's record.
    rec = board.pop_init(slot, req, INIT_WAIT_S)
    if rec is None:
        return EXIT_NO_INIT
    try:
        initializer, initargs, blas_threads, hang_timeout = _codec.loads(rec)
        # _thread, not Thread.start(): that waits until the new thread has run, a wait
        # every worker's start would pay (the GIL and, on a busy machine, a CPU to run on).
        # Beats are read only once the worker is ready: none are due while it starts.
        _thread.start_new_thread(_heartbeat, (board, slot, stop, beat_interval(hang_timeout)))
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


def _on_sigint(signum: int, frame: Any) -> None:
    """KeyboardInterrupt inside a task's own region only (_serve.in_task).  The pool
    sends SIGINT to a worker it saw running a task (_teardown.interrupt_running); one
    that lands as that task ends, or in the loop's code around it, is no task's to
    raise: the worker died of it, its traceback on the user's terminal (seen under
    load).  The loop handles a pending one before each task's body (_serve.pyx)."""
    from fastpool._runtime import _serve

    if _serve.in_task():
        raise KeyboardInterrupt


def _look_like_a_child(slot: int) -> None:
    """Makes multiprocessing see this worker as the pool owner's child process, as a
    ProcessPoolExecutor worker is: ``current_process().name`` is ``fastpool-worker-N`` and
    ``parent_process()`` names the owner (the template's parent), so code that refuses to
    start a pool inside a worker recognises one.

    Done when ``multiprocessing.process`` is first imported here (at once if the template
    had it already): a worker whose tasks never use multiprocessing never pays the ~3 ms
    of that import, which would otherwise delay every worker's start."""
    authkey = os.environ.pop("FASTPOOL_AUTHKEY", None)

    def apply(mpp: Any) -> None:
        template = os.getppid()
        owner = template
        try:
            with open(f"/proc/{template}/stat", "rb") as f:  # the template's own parent
                owner = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
        proc = mpp.current_process()
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

    loaded = sys.modules.get("multiprocessing.process")
    if loaded is not None:
        apply(loaded)
    else:
        sys.meta_path.insert(0, _AfterImport("multiprocessing.process", apply))


class _AfterImport:
    """A meta-path finder that runs ``then(module)`` right after module ``name`` is first
    executed, then leaves sys.meta_path.  It finds nothing itself: the module's own spec
    (from the path finder) is kept, with its loader wrapped."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader:
    def __init__(self, loader: Any, then: Callable[[Any], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package...: the real loader's
        return getattr(self.loader, name)


def _set_blas_threads(n: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n)
