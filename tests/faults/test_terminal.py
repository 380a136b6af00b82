"""The pool's processes and the script's terminal.

The template and its workers run in a process group of their own, so that Ctrl-C, which a
terminal sends to its foreground group, is the parent's to handle (test_interrupt), but in
the parent's session: a new session is a new scheduler autogroup, ~2 ms on a first pool's
start, and would set the workers apart from their parent for CPU time.  A background group
that writes to its terminal is stopped by SIGTTOU under ``stty tostop``: the workers ignore
it, so their prints go through.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _waiting import wait_gone

pytestmark = [pytest.mark.faults, pytest.mark.linux]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 60.0  # only a guard: the script's own result() gives up after RESULT_WAIT_S
RESULT_WAIT_S = 20


_GROUPS = textwrap.dedent("""
    import os, sys, time
    import fastpool
    from fastpool._runtime import _template

    if __name__ == "__main__":
        with fastpool.Pool(2) as pool:
            deadline = time.monotonic() + 60
            while len(pool.pids()) < 2:  # both workers up (wait_for, inline)
                assert time.monotonic() < deadline, pool.stats()
                time.sleep(0.005)
            pids = [_template.template().pid, *pool.pids()]
            print(os.getsid(0), os.getpgid(0), *(f"{os.getsid(p)}:{os.getpgid(p)}" for p in pids))
""")


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_the_template_and_workers_have_their_own_group_in_the_parents_session(tmp_path, start):
    # In a fresh script: this process runs threads, where the template is always spawned.
    script = tmp_path / "groups.py"
    script.write_text(_GROUPS)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "FASTPOOL_TEMPLATE_START": start},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    sid, pgid, *rows = done.stdout.split()
    pairs = [row.split(":") for row in rows]
    assert len(pairs) == 3  # the template and two workers
    assert {s for s, _ in pairs} == {sid}, (sid, pairs)  # the parent's session
    groups = {g for _, g in pairs}
    assert len(groups) == 1 and groups != {pgid}, (pgid, pairs)  # one group, not the parent's


_SCRIPT = textwrap.dedent("""
    import os, sys, termios
    sys.path.insert(0, {tests!r})
    import fastpool
    from fastpool._runtime import _template

    if __name__ == "__main__":
        attrs = termios.tcgetattr(1)
        attrs[3] |= termios.TOSTOP  # stty tostop: a background writer gets SIGTTOU
        termios.tcsetattr(1, termios.TCSANOW, attrs)
        with fastpool.Pool(1) as pool:
            pool.submit(int).result(timeout=30)
            print("pids", _template.template().pid, *pool.pids(), flush=True)
            try:
                pool.submit(print, "printed-by-the-worker", flush=True).result({wait})
            except TimeoutError:
                print("the-print-never-returned", flush=True)
                os._exit(3)  # the template sees its parent die and ends the worker
        print("script-done", flush=True)
""")


def _have_pty() -> bool:
    try:
        master, slave = os.openpty()
    except OSError:
        return False
    os.close(master)
    os.close(slave)
    return True


@pytest.mark.skipif(not _have_pty(), reason="no pseudo-terminal here (/dev/ptmx)")
def test_a_worker_prints_to_a_tostop_terminal_without_being_stopped(tmp_path):
    script = tmp_path / "tostop.py"
    script.write_text(_SCRIPT.format(tests=TESTS_DIR, wait=RESULT_WAIT_S))
    pid, master = pty.fork()  # the child leads a session whose terminal is the pty
    if pid == 0:
        try:
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)  # as a shell leaves it
            os.execv(sys.executable, [sys.executable, str(script)])
        finally:
            os._exit(127)
    out, pids = b"", []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while b"script-done" not in out and b"never-returned" not in out:
            left = deadline - time.monotonic()
            assert left > 0, out.decode(errors="replace")
            if select.select([master], [], [], left)[0]:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
                if not pids and b"pids" in out and b"\n" in out.split(b"pids", 1)[1]:
                    pids = [int(x) for x in out.split(b"pids", 1)[1].split(b"\n")[0].split()]
        status, pid = os.waitpid(pid, 0)[1], 0
        text = out.decode(errors="replace")
        assert "printed-by-the-worker" in text, text
        assert "script-done" in text, text
        assert status == 0, (status, text)
        wait_gone(pids)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.close(master)
