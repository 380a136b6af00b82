"""Ctrl-C in a script waiting inside ``with fastpool.Pool() as pool:`` (issue 9, section 5).

One SIGINT -- sent to the script, or to its process group as a terminal does --
must end the script promptly with KeyboardInterrupt: ``__exit__`` cancels the
queue and interrupts the running tasks instead of waiting for them, and no
worker or template outlives the script.  The gated tasks here end on their own
after GATE_LIMIT_S, leaving a file that says so; the script must be gone before
any of them gets there.  (ProcessPoolExecutor gets there
because its workers share the terminal's process group and get the SIGINT too;
fastpool's template and workers live in their own process group, so the pool itself
has to interrupt them.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from _waiting import wait_for, wait_gone

import fastpool

pytestmark = [pytest.mark.faults, pytest.mark.linux]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GATE_LIMIT_S = 8.0  # the gated tasks end on their own after this long (a fixed pool: ~0.5 s)
EXIT_DEADLINE_S = 60  # only a guard: the claim is the expiry file below

_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import fastpool, _tasks
    from _waiting import wait_for
    from fastpool._runtime import _template

    def wait_busy(pool):
        # and both pids known: a worker can take its first task (the board says busy)
        # before the supervisor has its pid (READY's hook runs after that dispatch)
        wait_for(
            lambda: sum(bool(w["current_task"]) for w in pool.stats()["workers"]) == 2
            and len(pool.pids()) == 2,
            60,
            lambda: f"both workers busy: {{pool.stats()['workers']}}, pids {{pool.pids()}}",
        )
        print("ready", _template.template().pid, *pool.pids(), flush=True)

    if __name__ == "__main__":
        gate, expired = sys.argv[1], sys.argv[2]
        {body}
        print("the pool ended without an interrupt", flush=True)
""")


_WITH = """with fastpool.Pool(2) as pool:
        futs = [pool.submit(_tasks.gate_or_expire, gate, expired, {limit}) for i in range(6)]
        wait_busy(pool)
        futs[0].result()"""

# No ``with``: the pool is shut down by fastpool's atexit hook after the
# KeyboardInterrupt has ended the script's main code.
_NO_WITH = """pool = fastpool.Pool(2)
    futs = [pool.submit(_tasks.gate_or_expire, gate, expired, {limit}) for i in range(6)]
    wait_busy(pool)
    futs[0].result()"""


def _interrupt_once(tmp_path, body: str, to_group: bool) -> None:
    """Runs the script, sends one SIGINT when both workers are busy, and checks it
    ended with KeyboardInterrupt, before any task ran to its end, leaving nothing."""
    script, expired = tmp_path / "ctrl_c.py", tmp_path / "a-task-ran-to-its-end"
    script.write_text(_SCRIPT.format(tests=TESTS_DIR, body=body.format(limit=GATE_LIMIT_S)))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "never-opened"), str(expired)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group, as a terminal job
    pids: list[int] = []
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], (line, proc.stderr.read() if proc.poll() is not None else "")
        pids = [int(x) for x in line[1:]]
        assert len(pids) == 3  # the template and two busy workers
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        # One SIGINT only: a second Ctrl-C must never be needed.
        out, err = proc.communicate(timeout=EXIT_DEADLINE_S)
        assert not expired.exists(), "the script waited for its tasks to end"
        assert "KeyboardInterrupt" in err, err
        assert proc.returncode in (-signal.SIGINT, 1, 130), (proc.returncode, err)
        assert "without an interrupt" not in out
        assert err.count("Traceback") == 1, err  # the interrupt's; nothing from the teardown
        wait_gone(pids)  # workers and template exit with it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("to_group", [False, True], ids=["to-the-parent", "to-its-process-group"])
def test_one_ctrl_c_ends_a_script_waiting_in_a_with_pool_and_leaves_no_process(tmp_path, to_group):
    _interrupt_once(tmp_path, _WITH, to_group)


@pytest.mark.slow
def test_one_ctrl_c_ends_a_script_waiting_on_a_pool_without_with(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground group; fastpool's workers
    are not in it, so only the pool can stop them."""
    _interrupt_once(tmp_path, _NO_WITH, to_group=True)


_MAP_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import fastpool, _tasks

    if __name__ == "__main__":
        gates = [sys.argv[1]] * 4
        with fastpool.Pool(1) as pool:
            for r in pool.map(_tasks.first_free, range(4), gates, chunksize=1, progress={progress}):
                print("took", r, flush=True)
""")


@pytest.mark.parametrize("progress", ["True", "None"])
def test_ctrl_c_in_a_map_shows_the_callers_line_not_fastpools_frames(tmp_path, progress):
    """Issue 32: Ctrl-C during ``map(progress=True)`` printed a 17-line traceback, mostly
    the dispatcher's frames under the map's wait.  The SIGINT lands in that wait: the
    script took item 0 and its main thread sleeps (items 1-3 wait for a gate never
    opened)."""
    import psutil

    if progress == "True":
        pytest.importorskip("tqdm")
    script = tmp_path / "ctrl_c_map.py"
    script.write_text(_MAP_SCRIPT.format(tests=TESTS_DIR, progress=progress))
    with subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "never-opened")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:  # its exit closes the pipes and waits
        try:
            line = proc.stdout.readline()
            assert line == "took 0\n", (line, proc.poll() is not None and proc.stderr.read())
            main = psutil.Process(proc.pid)  # its status is the main thread's
            wait_for(lambda: main.status() == psutil.STATUS_SLEEPING, what="the map's wait")
            os.kill(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=EXIT_DEADLINE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    tb = err[err.index("Traceback") :]
    assert tb.rstrip().endswith("KeyboardInterrupt"), err
    frames = [ln for ln in tb.splitlines() if ln.startswith('  File "')]
    assert str(script) in frames[0], tb  # the caller's line
    package = os.path.dirname(fastpool.__file__)
    assert len([f for f in frames if package in f]) <= 1, tb  # the map's own line at most


def test_a_sigint_that_reaches_a_worker_between_tasks_is_not_the_next_tasks():
    # The pool sends SIGINT to a worker it saw running a task (Ctrl-C in the parent).
    # One that lands as that task ends, or in the worker's loop around it, killed the
    # worker with a KeyboardInterrupt traceback on the terminal (seen under two CPU
    # hogs).  Here it lands on an idle worker: the next task runs, on that worker, and
    # gets its own result, not a KeyboardInterrupt.
    with fastpool.Pool(1) as p:
        pid = p.submit(os.getpid).result(timeout=30)
        os.kill(pid, signal.SIGINT)  # pending in the worker before the next task reaches it
        assert p.submit(os.getpid).result(timeout=30) == pid
        assert p.pids() == [pid]
        assert p.stats()["crashed"] == 0
