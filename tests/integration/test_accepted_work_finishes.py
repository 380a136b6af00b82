"""Accepted work finishes, as concurrent.futures promises (issue 15, section 3).

Each case is a real script in a fresh interpreter, because what it checks happens
when the pool object is dropped or when the interpreter exits: only
``shutdown(cancel_futures=True)`` or Ctrl-C drops work (Ctrl-C: faults/test_interrupt.py
and faults/test_cleanup.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _waiting import wait_for, wait_gone

TESTS_DIR = str(Path(__file__).resolve().parents[1])
ROOT = str(Path(__file__).resolve().parents[2])
SCRIPT_S = 120

_HEAD = """
import os, sys
sys.path.insert(0, {tests!r})
import fastpool, _tasks
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    source = _HEAD.format(tests=TESTS_DIR) + textwrap.dedent(body)
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS_DIR]))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=SCRIPT_S,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_map_over_a_pool_nobody_holds_returns_every_result(tmp_path: Path) -> None:
    # the Pool is dropped as soon as map() returns: its iterator keeps it alive
    proc = _run(
        tmp_path,
        """
        xs = range(-300, 0)
        print(sum(fastpool.Pool(2).map(abs, xs, chunksize=1)))
        """,
    )
    assert proc.stdout.split() == [str(sum(range(1, 301)))]


def test_futures_a_helper_returns_from_its_own_pool_all_settle(tmp_path: Path) -> None:
    proc = _run(
        tmp_path,
        """
        def helper():
            pool = fastpool.Pool(2)
            return [pool.submit(_tasks.sleep_then, i, 0.01) for i in range(40)]

        futures = helper()
        print(sum(f.result(timeout=60) for f in futures))
        print(sum(f.cancelled() for f in futures))
        """,
    )
    assert proc.stdout.split() == [str(sum(range(40))), "0"]


@pytest.mark.parametrize(
    "ending",
    [
        "pool.shutdown(wait=False)",  # ProcessPoolExecutor runs all 40 here
        "pass",  # the pool is still referenced when the script ends
        "del pool",  # dropped: its finalizer must not cancel the queue
    ],
)
def test_the_end_of_the_script_waits_for_every_accepted_task(tmp_path: Path, ending: str) -> None:
    _run(
        tmp_path,
        f"""
        out = sys.argv[1]
        pool = fastpool.Pool(2)
        for i in range(40):
            pool.submit(_tasks.touch_then_sleep, os.path.join(out, f"ran-{{i}}"), i, 0.02)
        {ending}
        """,
    )
    ran = sorted(p.name for p in tmp_path.glob("ran-*"))
    assert len(ran) == 40, ran


def test_shutdown_cancel_futures_still_drops_the_queue_at_exit(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
        out = sys.argv[1]
        pool = fastpool.Pool(1)
        for i in range(40):
            pool.submit(_tasks.touch_then_sleep, os.path.join(out, f"ran-{i}"), i, 0.05)
        pool.shutdown(wait=False, cancel_futures=True)
        """,
    )
    assert len(list(tmp_path.glob("ran-*"))) < 40


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.linux
def test_ctrl_c_while_the_exit_waits_for_accepted_work_stops_it(tmp_path: Path) -> None:
    """The exit waits for accepted work, but a Ctrl-C there still stops the pool:
    running tasks are interrupted, queued ones dropped, the workers exit."""
    script = tmp_path / "script.py"
    script.write_text(
        _HEAD.format(tests=TESTS_DIR)
        + textwrap.dedent(
            """
            import atexit, time
            out = sys.argv[1]
            pool = fastpool.Pool(2)
            # atexit runs the latest first: this says the exit began, fastpool's hook follows
            atexit.register(print, "exiting", flush=True)
            for i in range(20):
                pool.submit(_tasks.touch_then_sleep, os.path.join(out, f"ran-{i}"), i, 600)
            while sum(bool(w["current_task"]) for w in pool.stats()["workers"]) < 2:
                time.sleep(0.005)
            print(*pool.pids(), flush=True)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS_DIR]))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2
        assert proc.stdout.readline().strip() == "exiting"  # type: ignore[union-attr]
        # A SIGINT that lands between two exit hooks is swallowed by the one before
        # ours; send it once the main thread sleeps, which it does only in our wait.
        wait_for(lambda: _state(proc.pid) == "S", what="the exit to wait for the tasks")
        proc.send_signal(signal.SIGINT)
        proc.wait(SCRIPT_S)  # the tasks sleep 600 s: only the interrupt ends it this soon
        wait_gone(pids)
        assert len(list(tmp_path.glob("ran-*"))) < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
