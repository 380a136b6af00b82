"""When the template fails, the pool says so and goes on: a template killed (its
workers' tasks fail at once and a new template serves), one whose creating thread
exits (it lives on), one that cannot fork a worker or cannot open its pidfd (it says
so and lives on).

The last two talk to the template at its protocol level (connect, send "spawn", read the
reply): what the pool does with ("spawn-failed", req, errno, text) is the
supervisor's business (a failed start of that slot: backoff, then the breaker).
The limits are real: a pids cgroup the template is moved into (fork() fails with
EAGAIN, as under a process limit) and a lowered RLIMIT_NOFILE (pidfd_open() fails
with EMFILE).
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import threading
from pathlib import Path
from typing import Iterator

import _tasks
import psutil
import pytest
from _waiting import running, wait_for

import fastpool
from fastpool import WorkerCrashed
from fastpool._native._core import Board
from fastpool._runtime import _template
from fastpool._supervision import _supervisor

pytestmark = [pytest.mark.faults, pytest.mark.linux]

REPLY_TIMEOUT_S = 30.0


def test_pool_created_in_a_thread_that_exits_keeps_working():
    fastpool.shutdown_template()  # the next pool starts a template from the thread below
    box = {}

    def make():
        box["pool"] = fastpool.Pool(1, backoff_base_s=0.01)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    p = box["pool"]
    try:
        tpid = _template.template().pid
        # PR_SET_PDEATHSIG fires when the creating *thread* exits, and the kernel sends
        # it before the thread leaves /proc/self/task: once it has left, a template
        # tied to it has been sent its SIGKILL.
        wait_for(
            lambda: str(t.native_id) not in os.listdir("/proc/self/task"),
            what="the creating thread to exit",
        )
        assert p.submit(_tasks.double, 5).result(timeout=30) == 10
        assert _template.template().pid == tpid and running(tpid)
        assert p.stats()["crashed"] == 0
    finally:
        p.shutdown()


def test_killed_template_fails_its_workers_tasks_at_once_and_the_pool_goes_on(
    tmp_path, monkeypatch
):
    # No wait for an exit status that cannot come: with that wait made 60 s a worker, the
    # task's 30 s result() shows it, where a bound of 1 s on a loaded machine was a race.
    monkeypatch.setattr(_supervisor, "EXIT_STATUS_WAIT_S", 60.0)
    started = tmp_path / "started"
    with fastpool.Pool(2, backoff_base_s=0.01) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        busy = p.submit(_tasks.touch_then_sleep, str(started), 1, 30)
        wait_for(started.exists, what="the task to start")
        old = _template.template().pid
        os.kill(old, signal.SIGKILL)  # both workers die with it
        with pytest.raises(WorkerCrashed) as info:
            busy.result(timeout=30)
        assert info.value.exitcode == -signal.SIGKILL
        assert [p.submit(_tasks.double, i).result(timeout=30) for i in range(4)] == [0, 2, 4, 6]
        assert _template.template().pid not in (None, old)


def test_a_pool_refused_after_its_template_began_leaves_it_to_the_next_pool():
    # The first pool forks its template before it builds the rings (Template.begin); a
    # refusal there leaves that template starting, and the next pool uses it.
    fastpool.shutdown_template()
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    # initargs that cannot be pickled (since 388ef5b a large pickle spills into shared
    # memory instead of being refused over the ring limit, which this test used before)
    with pytest.raises(fastpool.SerializationError, match="initargs"):
        fastpool.Pool(1, initargs=(threading.Lock(),))
    (begun,) = {c.pid for c in me.children()} - before
    assert _template.template().pid == begun  # starting, not yet awaited
    with fastpool.Pool(1) as p:
        assert p.submit(_tasks.double, 4).result(timeout=30) == 8
        assert _template.template().pid == begun
    fastpool.shutdown_template()
    assert not running(begun)


def _pids_hierarchy() -> Path | None:
    """Where a pids controller is mounted that this process may add a group to."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        fstype, mount, opts = fields[sep + 1], Path(fields[4]), fields[sep + 3].split(",")
        if fstype == "cgroup" and "pids" in opts:
            return mount
        if fstype == "cgroup2":
            try:
                if "pids" in (mount / "cgroup.subtree_control").read_text().split():
                    return mount
            except OSError:
                continue
    return None


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    """A new pids cgroup; whatever is still in it afterwards goes back to the root."""
    root = _pids_hierarchy()
    if root is None:
        pytest.skip(
            "no pids cgroup controller is mounted (cgroup v1 'pids', or v2 with pids enabled)"
        )
    group = root / f"fastpool-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a pids cgroup under {root}: {exc}")
    try:
        yield group
    finally:

        def emptied() -> bool:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:  # it exited meanwhile
                    pass
            try:
                group.rmdir()
            except OSError as exc:  # EBUSY: a process still exiting is counted in it
                if exc.errno != errno.EBUSY:
                    raise
                return False
            return True

        wait_for(emptied, what=f"{group} to empty")


def _request(conn, req: int, fds: list[int]) -> tuple:
    _template._send(conn, ("spawn", req, 0, {}), fds)
    conn.settimeout(REPLY_TIMEOUT_S)
    try:
        msg, got = _template._recv(conn)
    finally:
        conn.settimeout(None)
    assert msg is not None, "the template closed the connection"
    assert msg[1] == req, msg
    return msg, got


def test_a_template_that_cannot_fork_reports_spawn_failed_and_keeps_serving(
    pids_cgroup: Path,
) -> None:
    with fastpool.Pool(1) as pool:  # a pool on this process's template, its worker up
        assert pool.submit(_tasks.add, 1, 2).result(timeout=REPLY_TIMEOUT_S) == 3
        template = _template.template()
        tpid = template.pid
        conn = template.connect()
        board = Board.create(1, 1 << 16)
        pidfds: list[int] = []
        try:
            (pids_cgroup / "pids.max").write_text("1")
            (pids_cgroup / "cgroup.procs").write_text(str(tpid))  # the template alone: no fork

            msg, fds = _request(conn, 1, [board.fileno()])
            assert msg[0] == "spawn-failed" and fds == []
            assert msg[2] == errno.EAGAIN, msg

            assert template.pid == tpid and psutil.Process(tpid).status() != psutil.STATUS_ZOMBIE
            assert (
                pool.submit(_tasks.add, 2, 3).result(timeout=REPLY_TIMEOUT_S) == 5
            )  # others go on

            (pids_cgroup / "pids.max").write_text("max")
            msg, pidfds = _request(conn, 2, [board.fileno()])
            assert msg[0] == "pid" and len(pidfds) == 1, msg
            assert msg[2] in {c.pid for c in psutil.Process(tpid).children()}
        finally:
            conn.close()  # the template kills the worker it started for this connection
            board.close()
            for fd in pidfds:
                os.close(fd)
        assert pool.submit(_tasks.add, 3, 4).result(timeout=REPLY_TIMEOUT_S) == 7


def test_a_template_that_cannot_open_a_pidfd_reaps_that_worker_and_reports_spawn_failed() -> None:
    with fastpool.Pool(1) as pool:
        assert pool.submit(_tasks.add, 1, 2).result(timeout=REPLY_TIMEOUT_S) == 3
        template = _template.template()
        proc = psutil.Process(template.pid)
        conn = template.connect()
        board = Board.create(1, 1 << 16)
        limits = proc.rlimit(psutil.RLIMIT_NOFILE)
        pidfds: list[int] = []
        try:
            # A request without descriptors is refused without allocating any; once it is
            # answered the template is back in its loop and its fd table holds still.
            msg, _ = _request(conn, 1, [])
            assert msg[0] == "spawn-failed" and msg[2] == errno.EMFILE, msg
            workers_before = {c.pid for c in proc.children()}

            held = {int(n) for n in os.listdir(f"/proc/{proc.pid}/fd")}
            lowest_free = next(n for n in itertools.count(3) if n not in held)
            proc.rlimit(
                psutil.RLIMIT_NOFILE, (lowest_free + 1, limits[1])
            )  # room for the board fd only
            msg, fds = _request(conn, 2, [board.fileno()])
            assert msg[0] == "spawn-failed" and fds == []
            assert msg[2] == errno.EMFILE, msg
            assert {c.pid for c in proc.children()} == workers_before  # the forked one is reaped

            proc.rlimit(psutil.RLIMIT_NOFILE, limits)
            msg, pidfds = _request(conn, 3, [board.fileno()])
            assert msg[0] == "pid" and len(pidfds) == 1, msg
        finally:
            proc.rlimit(psutil.RLIMIT_NOFILE, limits)
            conn.close()
            board.close()
            for fd in pidfds:
                os.close(fd)
        assert pool.submit(_tasks.add, 3, 4).result(timeout=REPLY_TIMEOUT_S) == 7
