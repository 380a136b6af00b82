"""A worker's start is reported twice, on two channels that race:

    worker   --R_READY on the board---------> driver thread (collector or a waiter)
    template --("pid", req, pid) + pidfd----> supervisor thread (socket)

On a loaded machine either may come first.  These tests hold the pid message back
in this process until they release it (patching ``_template._recv``, which only the
parent's supervisor calls; the workers are forked by the template, a separate
process), so each ordering is certain instead of left to the scheduler.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import _faulty
import _tasks
import psutil
import pytest
from conftest import make_pool

import fastpool
from fastpool._runtime import _template
from fastpool._supervision import _supervisor

RESULT_S = 30


class HeldPid:
    """The supervisor's read of each ("pid", ...) message, held until ``release()``.

    ``held`` is set once the supervisor holds one; ``delivered`` once it has been
    handed on.  After ``release()`` every later message passes straight through."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.released = threading.Event()
        self.delivered = threading.Event()

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def held_pid(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldPid]:
    gate = HeldPid()
    real_recv = _template._recv

    def recv(sock: Any) -> Any:
        msg, fds = real_recv(sock)
        if msg and msg[0] == "pid":
            gate.held.set()
            gate.released.wait(RESULT_S)  # bounded: a failing test never strands the supervisor
            gate.delivered.set()
        return msg, fds

    monkeypatch.setattr(_template, "_recv", recv)
    try:
        yield gate
    finally:
        gate.release()


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """Every SIGKILL the pool decides on, as (slot, reason).  Spied on, because a
    killed worker's exit status goes to the template, not to this process."""
    seen: list = []
    real_kill = _supervisor.Supervisor.kill

    def spy(self: Any, slot: Any, reason: Any) -> None:
        seen.append((slot.id, reason))
        real_kill(self, slot, reason)

    monkeypatch.setattr(_supervisor.Supervisor, "kill", spy)
    yield seen


def test_a_worker_ready_before_its_pid_is_known_still_gets_work(held_pid: HeldPid) -> None:
    with make_pool(1) as pool:
        try:
            assert held_pid.held.wait(RESULT_S)
            # served while the supervisor still holds the pid message
            assert pool.submit(_tasks.add, 1, 2).result(timeout=RESULT_S) == 3
            assert not held_pid.delivered.is_set()
        finally:
            held_pid.release()


@pytest.mark.faults
def test_the_death_of_a_worker_ready_before_its_pid_is_known_is_still_noticed(
    held_pid: HeldPid,
) -> None:
    # Crash detection waits on the worker's pidfd, which arrives with the pid
    # message; a slot that went ready first must still get it, or a crash there
    # leaves its task's future unsettled for ever.
    with make_pool(1) as pool:
        try:
            assert held_pid.held.wait(RESULT_S)
            assert pool.submit(_tasks.add, 1, 2).result(timeout=RESULT_S) == 3  # ready, pid unknown
        finally:
            held_pid.release()
        assert held_pid.delivered.wait(RESULT_S)  # now the pid message reaches the supervisor
        doomed = pool.submit(_faulty.sigkill_self)
        with pytest.raises(fastpool.WorkerCrashed):
            doomed.result(timeout=RESULT_S)
        assert pool.submit(_tasks.add, 2, 2).result(timeout=RESULT_S) == 4  # replaced


def test_shutdown_stops_a_worker_whose_pid_arrives_during_shutdown(
    held_pid: HeldPid, kills: list, tmp_path: Path
) -> None:
    # Shut down while the worker is still starting (its initializer waits on a gate)
    # and while the supervisor holds its pid message: the worker must get a stop
    # request like the others, not a SIGKILL after STOP_GRACE_S (which loses what
    # it had not flushed, and made fresh pools in this suite take exactly 2.0 s to
    # shut down).
    gate = tmp_path / "init-may-return"
    with make_pool(1, initializer=_tasks.gate, initargs=(str(gate),)) as pool:
        try:
            assert held_pid.held.wait(RESULT_S)  # forked, still in its initializer
            pool.shutdown(wait=False)
        finally:
            held_pid.release()  # the pid arrives during shutdown
            gate.touch()
        pool.shutdown(wait=True)
    assert kills == []


@pytest.fixture
def deaf_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor thread that reads nothing from the template until shutdown: every
    ("pid", ...) reply is still unread when the pool tears down, as when shutdown follows
    Pool() at once on a loaded machine (CPython's test_pool_initializer)."""

    def run(self: Any) -> None:
        while not self.stopping:
            _supervisor.select_read(self._wake_r, 1.0)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)

    monkeypatch.setattr(_supervisor.Supervisor, "run", run)


def test_shutdown_waits_for_a_starting_worker_to_run_its_initializer(
    deaf_supervisor: None, tmp_path: Path
) -> None:
    # multiprocessing's contract: close(); join() returns once every worker exited, each
    # having run its initializer.  A worker whose pidfd had not reached the supervisor
    # was neither waited for nor stopped: the template ended it when the pool released
    # its connection, often before its initializer ran.
    noted = tmp_path / "initializer-ran"
    with make_pool(1, initializer=_tasks.note_pid, initargs=(str(noted),)) as pool:
        pool.shutdown(wait=True)
    assert noted.exists(), "shutdown returned before the starting worker ran its initializer"
    assert pool.pids() == []
    pid = int(noted.read_text())
    try:
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited; its parent reaps
    except psutil.NoSuchProcess:
        pass


@pytest.fixture
def supervisor_sees_deaths(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A supervisor thread that, once shutdown stops it, runs on until it has handled every
    worker's exit (_on_pidfd: the pidfd closed, the death queued), and deaths that nobody
    judges once the pool stops (the driver thread had not got to them before the reap), as
    when the workers' exits reach the supervisor before its stop; and a record of every
    wait on the template connection (select_read on anything but a pidfd) after that."""
    waits: list[Any] = []
    real_select_read = _supervisor.select_read
    real_on_attention = _supervisor.Supervisor.on_attention

    def on_attention(self: Any) -> None:
        if not self.stopping:
            real_on_attention(self)

    def run(self: Any) -> None:
        deadline = time.monotonic() + RESULT_S  # bounded: a failing test never hangs
        while time.monotonic() < deadline and (
            not self.stopping or any(s.pidfd is not None for s in self.slots)
        ):
            self._once()
        monkeypatch.setattr(_supervisor, "select_read", select_read)

    def select_read(fd: Any, timeout: float) -> bool:
        if not isinstance(fd, int):  # the template's connection (pidfds are ints)
            waits.append(timeout)
        return real_select_read(fd, timeout)

    monkeypatch.setattr(_supervisor.Supervisor, "run", run)
    monkeypatch.setattr(_supervisor.Supervisor, "on_attention", on_attention)
    return waits


def test_shutdown_does_not_wait_for_replies_of_workers_whose_exit_it_saw(
    supervisor_sees_deaths: list[Any],
) -> None:
    # A worker whose exit the supervisor handled before teardown has no pidfd any more,
    # like a worker whose template reply has not come: shutdown waited the whole stop
    # grace (2 s) for a reply that had come long before, in about half of the fresh
    # pools' shutdowns on two cores.
    with make_pool(2) as pool:
        assert pool.submit(_tasks.double, 3).result(timeout=RESULT_S) == 6
        pool.shutdown(wait=True)
    assert supervisor_sees_deaths == [], "shutdown waited on the template for dead workers"
    assert pool.pids() == []
