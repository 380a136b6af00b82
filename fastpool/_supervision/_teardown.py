"""Ending a pool's workers: the stop, Ctrl-C's interrupt, a forked child's disowning,
terminate/kill_workers, and the wait for every worker to exit.

    Runtime.shutdown/teardown -> stop_workers (K_STOP to each) -> reap_workers (wait,
                                 SIGKILL after the grace, close the pidfds)
    Runtime.interrupt          -> interrupt_running (SIGINT to workers running a task)
    Pool.terminate_workers     -> force_stop (sig to every live worker)
    Runtime.disown (a fork)    -> disown (the child's copies of the pidfds closed)

Each acts on a Supervisor (its slots, lock, board and template connection); the
supervisor thread has stopped before stop_workers and reap_workers run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING

from fastpool._runtime import _codec
from fastpool._runtime._lazy import LazyModule
from fastpool._supervision._slot import select_read

if TYPE_CHECKING:
    from fastpool._supervision import _verdict
    from fastpool._supervision._supervisor import Supervisor
else:
    _verdict = LazyModule("fastpool._supervision._verdict")  # as _supervisor: at first use

STOP_GRACE_S = 2.0


def stop_workers(sup: Supervisor) -> None:
    """Asks every live worker to exit, then SIGKILLs stragglers after STOP_GRACE_S.

    Called once the supervisor thread has stopped."""
    with sup.lock:
        sup.stopping = True
        for slot in sup.slots:
            if slot.live:  # its pid may not have arrived yet
                slot.kill = _verdict.Kill(_verdict.Cause.STOPPED)
                sup.disp.slot_stopping(slot.id)
                if not sup.board.push_control(slot.id, _codec.K_STOP):
                    sup.kill(slot, _verdict.Kill(_verdict.Cause.STOPPED))
    sup.wake()


def interrupt_running(sup: Supervisor) -> None:
    """SIGINT to every worker running a task: the task raises KeyboardInterrupt."""
    with sup.lock:
        for slot in sup.slots:
            if slot.pidfd is not None and slot.state == "ready" and sup.board.current(slot.id):
                try:
                    signal.pidfd_send_signal(slot.pidfd, signal.SIGINT)
                except (ProcessLookupError, OSError):
                    pass


def disown(sup: Supervisor) -> None:
    """In a forked child: its copies of the workers' pidfds are closed (the parent's
    stay open), so that no path of this copy can signal the parent's workers.  Takes
    no lock: a thread of the parent may have held it at the fork."""
    for slot in sup.slots:
        pidfd, slot.pidfd = slot.pidfd, None
        if pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(pidfd)


def force_stop(sup: Supervisor, sig: int, detail: str) -> None:
    """Pool.terminate_workers/kill_workers: ``sig`` to every live worker.  From now on no
    worker starts, and what a dead worker held fails (_judge): the task it ran with
    WorkerCrashed, those it had not started with BrokenPool; none runs again."""
    with sup.lock:
        sup.forced = True
        for slot in sup.slots:
            if slot.pidfd is not None:
                slot.kill = _verdict.Kill(_verdict.Cause.TERMINATED, None, detail)
                try:
                    signal.pidfd_send_signal(slot.pidfd, sig)
                except (ProcessLookupError, OSError):
                    pass


def reap_workers(sup: Supervisor, grace_s: float = STOP_GRACE_S) -> None:
    """Waits up to ``grace_s`` for every worker to exit (SIGKILL after), once the
    supervisor thread has stopped.  A worker whose start the template has not yet
    answered is waited for too: it runs its K_INIT (the initializer) and then the
    K_STOP that stop_workers queued, and a join that returned before it exits would
    leave a process behind and an initializer that has not run yet."""
    deadline = time.monotonic() + grace_s
    sup.await_started(deadline)
    for slot in sup.slots:
        if slot.pidfd is None:
            slot.pid = None  # no pidfd ever came: nothing of ours to list or signal
            continue
        if not select_read(slot.pidfd, max(0.0, deadline - time.monotonic())):
            sup.kill(slot, _verdict.Kill(_verdict.Cause.STOPPED))
            select_read(slot.pidfd, 2.0)
        os.close(slot.pidfd)
        slot.pidfd = None
        slot.pid = None
        slot.state = "dead"
