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
import sys
import textwrap
import time

import pytest
from _waiting import wait_for, wait_gone

import fastpool
from fastpool._runtime import _template

pytestmark = [pytest.mark.faults, pytest.mark.linux]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 60.0  # only a guard: the script's own result() gives up after RESULT_WAIT_S
RESULT_WAIT_S = 20


def test_the_template_and_workers_have_their_own_group_in_the_parents_session():
    with fastpool.Pool(2) as pool:
        workers = wait_for(lambda: len(pool.pids()) == 2 and pool.pids(), what="two workers")
        pids = [_template.template().pid, *workers]
        assert len(pids) == 3
        groups = {os.getpgid(pid) for pid in pids}
        assert groups == {pids[0]}, groups  # the template's group, the workers in it
        assert os.getpgid(0) not in groups
        assert {os.getsid(pid) for pid in pids} == {os.getsid(0)}


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
