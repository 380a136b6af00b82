"""Accepted work finishes, as concurrent.futures promises (issue 15, section 3).

Each case is a real script in a fresh interpreter, because what it checks happens
when the pool object is dropped or when the interpreter exits: only
``shutdown(cancel_futures=True)`` or Ctrl-C drops work (Ctrl-C: faults/test_interrupt.py
and faults/test_cleanup.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
