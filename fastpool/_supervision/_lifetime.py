"""A pool's life: building its board, arena, dispatcher and supervisor from checked
options (``start``), then shutdown, interrupt and teardown (``Runtime``), at
interpreter exit (``_shutdown_all_at_exit``) and in a forked child
(``_disown_after_fork``).

``fastpool.pool`` checks a Pool's options and hands them here.  Nothing in this
module holds the Pool object, so a pool dropped without ``shutdown`` is collected
and shuts itself down, after the work it accepted settles.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import traceback
import weakref
from typing import Any, Callable, Literal

from fastpool import errors, telemetry
from fastpool._native import _arena
from fastpool._native._core import Board
from fastpool._runtime import _codec, _controls, _dispatch
from fastpool._supervision import _policy, _teardown
from fastpool._supervision._supervisor import Supervisor
from fastpool._supervision._teardown import STOP_GRACE_S

log = logging.getLogger("fastpool")

INTERRUPT_GRACE_S = 0.4  # Ctrl-C: how long interrupted tasks get to return before SIGKILL

_dispatch.set_parent_spin(float(os.environ.get("FASTPOOL_PARENT_SPIN_US", "80")) * 1e-6)
_live: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


def _shutdown_all_at_exit() -> None:
    """At interpreter exit, every pool finishes the work it accepted, as
    ProcessPoolExecutor's exit hook does (concurrent/futures/process.py,
    ``_python_exit``): only ``cancel_futures=True`` dropped work earlier.

    A script that ends on Ctrl-C (or is interrupted while it waits here) must
    not wait for its running tasks: the workers run in their own process group, so
    the terminal's SIGINT never reached them.  Interrupt them as __exit__ would."""
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    interrupted = isinstance(last, KeyboardInterrupt)
    for rt in list(_live):
        try:
            if not interrupted:
                try:
                    rt.shutdown(wait=True, cancel_futures=False)
                    continue
                except KeyboardInterrupt:
                    interrupted = True
            rt.interrupt()
        except BaseException:  # noqa: BLE001 - interpreter teardown: best effort, even a 2nd Ctrl-C
            pass


# Plain atexit, not threading._register_atexit as CPython's executors use: this runs
# after the non-daemon threads were joined, so a lazy map that such a thread still
# consumes keeps submitting its chunks until it ends.
atexit.register(_shutdown_all_at_exit)


def _disown_after_fork() -> None:
    # A forked child inherits every pool's objects but none of its threads, and the
    # workers are the parent's: the child must never stop, signal or kill them, write
    # the board, or unmap what they use.  Its atexit hook then
    # finds no pool, and its finalisers find closed, disowned ones.
    for rt in list(_live):
        rt.disown()
    _live.clear()


os.register_at_fork(after_in_child=_disown_after_fork)


def _refuse_inherited_only(exc: BaseException) -> None:
    """initargs with a multiprocessing Lock, Queue, Event...: those pass only by inheritance
    to a child of the process that made them, and fastpool's workers are the template's
    children, so they are refused with the alternative named."""
    cause = exc.__cause__
    if isinstance(cause, RuntimeError) and "through inheritance" in str(cause):
        raise TypeError(
            "initargs holds a multiprocessing synchronisation object (Lock, Queue, Event, "
            f"Semaphore...: {cause}); fastpool's workers are not children of this process, so "
            "it cannot be inherited. Pass a multiprocessing.Manager() proxy instead (m = "
            "multiprocessing.Manager(); Pool(initargs=(m.Lock(),)) or m.Queue(), m.Event())"
        ) from exc


def _abandoned(task: Any) -> BaseException:
    if task.t_dispatch:
        return errors.BrokenPool(
            f"the pool was shut down while task {task.id} ran (or was held by a "
            "worker); its worker was stopped"
        )
    return errors.BrokenPool(f"the pool was shut down before task {task.id} ran")


def start(
    workers: int,
    *,
    initializer: Callable[..., object] | None,
    initargs: tuple[Any, ...],
    blas_threads: int,
    keep: list,
    ring_bytes: int,
    arena_bytes: int | None,
    max_queue: int,
    on_full: Literal["block", "reject"],
    queue_timeout: float | None,
    max_tasks_per_worker: int | None,
    settings: dict[str, Any],
    breaker: Callable[[], _policy.SlotBreaker],
) -> Runtime:
    """Builds a pool's running parts from options ``fastpool.pool`` checked, spawns its
    workers and starts its threads.  ``keep`` receives the blocks of shared arrays in
    ``initargs``, which must live as long as the pool.

    Raises SerializationError when ``initializer`` or ``initargs`` cannot be pickled
    (TypeError naming the alternative for a multiprocessing lock or queue), ValueError
    when they do not fit a ring, RuntimeError when the worker template cannot start;
    whatever was opened is closed again first."""
    init_fn = _codec.function_bytes(initializer) if initializer is not None else None
    opened: list[Any] = []
    try:
        board = Board.create(workers, ring_bytes)
        opened.append(board)
        arena = _arena.Arena.create(
            workers, _arena.default_budget() if arena_bytes is None else arena_bytes
        )
        opened.append(arena)
        try:
            init_payload = _codec.encode_init(
                (init_fn, tuple(initargs), blas_threads, settings["hang_timeout"]), arena, keep
            )
        except errors.SerializationError as exc:
            _refuse_inherited_only(exc)
            raise
        if len(init_payload) > board.max_record:  # in shared memory, for every worker's start
            init_payload = _codec.spill(init_payload, arena, keep)
        tel = telemetry.Telemetry()
        disp = _controls.Dispatcher(
            board,
            workers,
            max_queue=max_queue,
            reject=on_full == "reject",
            queue_timeout=queue_timeout,
            max_tasks=max_tasks_per_worker,
            arena=arena,
            hooks=None,
        )
        sup = Supervisor(workers, board, arena, disp, tel, init_payload, settings, breaker)
        opened.append(sup)
        disp.set_hooks(sup)
        sup.spawn_all()
    except BaseException:
        for thing in reversed(opened):  # the connection's close also ends any worker started
            thing.close()
        raise
    rt = Runtime(board, arena, disp, sup, tel)
    rt.start()
    return rt


class Runtime:
    """A pool's running parts and their life: threads, teardown.  Holds no Pool."""

    def __init__(
        self,
        board: Board,
        arena: _arena.Arena,
        disp: _controls.Dispatcher,
        sup: Supervisor,
        tel: telemetry.Telemetry,
    ) -> None:
        self.board, self.arena, self.disp, self.sup, self.tel = board, arena, disp, sup, tel
        self.lock = threading.Lock()
        self.stopping = False
        self.disowned = False  # a forked child's copy of the parent's pool: never touched
        self.owner_pid = os.getpid()
        self.torn_down = threading.Event()
        self.handoff = threading.Event()
        self.supervisor_thread = threading.Thread(
            target=sup.run, name="fastpool-supervisor", daemon=True
        )
        self.collector_thread = threading.Thread(
            target=self._collect, name="fastpool-collector", daemon=True
        )

    def start(self) -> None:
        self.supervisor_thread.start()
        self.collector_thread.start()
        _live.add(self)

    def _idle_closed(self) -> bool:
        return (
            self.disp.closed
            and (self.disp.inflight == 0 or self.stopping)
            and not self.board.wanted()
        )

    def _collect(self) -> None:
        self.disp.collector_loop(self.handoff, self._idle_closed)
        if not self.torn_down.is_set():
            self.teardown()

    def disown(self) -> None:
        """In a forked child: closed for submits, every teardown path a no-op, no future
        of the parent's driven here (each unsettled one fails with PoolClosed), and no
        worker signalled (the child's copies of the pidfds are closed)."""
        self.disowned = self.stopping = True
        self.torn_down.set()
        self.disp.disown(self._not_the_owner)
        _teardown.disown(self.sup)
        self.board.disown()  # the arena disowns itself (fastpool/_native/_arena.pyx)

    def _not_the_owner(self, task: Any) -> BaseException:
        return errors.PoolClosed(
            f"task {task.id} belongs to a pool of process {self.owner_pid}; this process "
            f"(pid {os.getpid()}) was forked from it and holds a copy of its future, which "
            "only that process can wait for: wait before the fork, or send the result "
            "to the child"
        )

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        if self.disowned:
            return
        self.disp.close()
        if cancel_futures:
            self.disp.cancel_queued()
        self.board.kick()
        if wait and self.disp.holding_drive():
            # Called from a done-callback on the thread that consumes results: waiting
            # here would wait on ourselves.  The collector finishes the teardown.
            wait = False
        if wait:
            self.disp.drive(lambda: self.disp.inflight == 0 or self.stopping, None)
            self.teardown()
        else:
            self.handoff.set()

    def interrupt(self) -> None:
        """Ctrl-C: cancel the queue, interrupt running tasks, tear down within ~1 s."""
        if self.disowned:
            return
        self.disp.close()
        self.disp.cancel_queued()
        _teardown.interrupt_running(self.sup)
        try:  # what the interrupted tasks send back (their KeyboardInterrupt) settles
            self.disp.drive(lambda: self.disp.inflight == 0, INTERRUPT_GRACE_S)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: still tear down, only faster
        self.teardown(grace_s=INTERRUPT_GRACE_S)

    def teardown(self, grace_s: float = STOP_GRACE_S) -> None:
        with self.lock:
            already, self.stopping = self.stopping, True
        if already:
            self.torn_down.wait(10)
            return
        disp, sup = self.disp, self.sup
        disp.close()
        disp.cancel_queued()
        try:
            _teardown.stop_workers(sup)
            self.supervisor_thread.join(5)
            _teardown.reap_workers(sup, grace_s)
            disp.abandon(_abandoned)
        finally:
            disp.set_torn_down()
            self.torn_down.set()
            if threading.current_thread() is not self.collector_thread:
                self.collector_thread.join(5)
            others = [
                t
                for t in (self.collector_thread, self.supervisor_thread)
                if t.is_alive() and t is not threading.current_thread()
            ]
            if others:
                # A thread that still runs may be inside a wait on the board: unmapping
                # under it would crash the process.  Leave the mappings to process exit.
                frames = sys._current_frames()
                log.error(
                    "fastpool: %s did not stop; the pool's shared memory stays mapped\n%s",
                    ", ".join(t.name for t in others),
                    "".join(
                        f"{t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
                        for t in others
                        if t.ident in frames
                    ),
                )
            else:
                disp.lock_drive()
                try:
                    self.board.close()
                finally:
                    disp.unlock_drive()
                self.arena.close()
            sup.close()
            _live.discard(self)
