"""A worker's start is reported twice, on two channels that race:

    worker   --R_READY on the board---------> driver thread (collector or a waiter)
    template --("pid", req, pid) + pidfd----> supervisor thread (socket)

On a loaded machine either may come first.  These tests hold the pid message back
in this process (patching ``_template._recv``, which only the parent's supervisor
calls; the workers are forked by the template, a separate process) so each
ordering is certain instead of left to the scheduler.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

import _tasks
import fastpool
from conftest import make_pool
from fastpool import _template
from fastpool import _supervisor

RESULT_S = 30
PID_DELAY_S = 0.3


@pytest.fixture
def late_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor reads each ("pid", ...) message PID_DELAY_S late."""
    real_recv = _template._recv

    def recv(sock: Any) -> Any:
        msg, fds = real_recv(sock)
        if msg and msg[0] == "pid":
            time.sleep(PID_DELAY_S)
        return msg, fds

    monkeypatch.setattr(_template, "_recv", recv)


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


def test_a_worker_ready_before_its_pid_is_known_still_gets_work(late_pid: None) -> None:
    with make_pool(1) as pool:
        assert pool.submit(_tasks.add, 1, 2).result(timeout=RESULT_S) == 3


@pytest.mark.faults
def test_the_death_of_a_worker_ready_before_its_pid_is_known_is_still_noticed(late_pid: None) -> None:
    # Crash detection waits on the worker's pidfd, which arrives with the pid
    # message; a slot that went ready first must still get it, or a crash there
    # leaves its task's future unsettled for ever.
    with make_pool(1) as pool:
        assert pool.submit(_tasks.add, 1, 2).result(timeout=RESULT_S) == 3
        time.sleep(2 * PID_DELAY_S)  # the pid message has been read by now
        doomed = pool.submit(_tasks.sigkill_self)
        with pytest.raises(fastpool.WorkerCrashed):
            doomed.result(timeout=RESULT_S)
        assert pool.submit(_tasks.add, 2, 2).result(timeout=RESULT_S) == 4  # replaced


def test_shutdown_stops_a_worker_whose_pid_arrives_during_shutdown(late_pid: None, kills: list) -> None:
    # Shut down while the worker is still starting (its initializer sleeps) and
    # while the supervisor is still reading its pid message: the worker must get
    # a stop request like the others, not a SIGKILL after STOP_GRACE_S (which
    # loses what it had not flushed, and made fresh pools in this suite take
    # exactly 2.0 s to shut down).
    with make_pool(1, initializer=_tasks.sleep_then, initargs=(None, 0.5)) as pool:
        time.sleep(0.05)  # the worker is forked; the supervisor holds its pid message
        pool.shutdown(wait=True)
    assert kills == []
