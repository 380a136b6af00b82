"""Workers do not outlive the parent, even while another child of the parent holds a
copy of the template's sockets (issue 9, section 5).

The parent makes a pool, forks a child that only sleeps (it inherits the template's
control socket and the pool's connection, so the template never sees end of file),
and is SIGKILLed. The template watches a pidfd of the parent process itself: it and
every worker must go. The test waits on the processes (psutil.wait_procs, which
polls their state), not on a fixed sleep, and kills the sleeping child itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

pytestmark = [pytest.mark.faults, pytest.mark.linux]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GONE_WITHIN_S = 10.0

_PARENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import numpy
    import fastpool, _tasks
    from _waiting import wait_for
    from fastpool._runtime import _template
    if __name__ == "__main__":
        p = fastpool.Pool(2)
        assert sorted(p.map(_tasks.double, range(4))) == [0, 2, 4, 6]
        busy = [p.submit(_tasks.sleep_then, i, 600) for i in range(2)]
        wait_for(lambda: len(p.pids()) == 2, 60, "both workers' pids")
        kind = type(_template.template()._proc).__name__
        child = os.fork()  # keeps every socket of the parent open
        if child == 0:
            time.sleep(600)
            os._exit(0)
        print(kind, child, _template.template().pid, *p.pids(), flush=True)
        print(*_template.template().how, flush=True)  # why it started so, for a failure
        time.sleep(600)
""")


@pytest.mark.parametrize("method, kind", [("", "_ForkedProcess"), ("spawn", "Popen")])
def test_template_and_workers_die_with_the_parent_while_its_fork_child_holds_their_sockets(
    tmp_path, method, kind
):
    script = tmp_path / "parent.py"
    script.write_text(_PARENT.format(tests=TESTS_DIR))
    env = dict(os.environ, FASTPOOL_TEMPLATE_START=method)
    parent = subprocess.Popen(
        [sys.executable, "-W", "ignore::DeprecationWarning", str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    child = None
    try:
        fields = parent.stdout.readline().split()
        how = parent.stdout.readline().strip()
        child, template, *workers = (int(x) for x in fields[1:])
        assert fields[0] == kind, (fields, how)
        assert len(workers) == 2
        watched = [psutil.Process(pid) for pid in (template, *workers)]
        parent.kill()
        parent.wait()
        assert psutil.pid_exists(child)  # the socket holder is still there
        _gone, alive = psutil.wait_procs(watched, timeout=GONE_WITHIN_S)
        assert alive == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
        if child is not None:
            try:
                holder = psutil.Process(child)
                holder.send_signal(signal.SIGKILL)
                holder.wait(GONE_WITHIN_S)
            except psutil.NoSuchProcess:
                pass
