"""Nothing outlives a pool: not after shutdown, not after crashes, not after the parent dies."""

import os
import signal
import subprocess
import sys
import textwrap

import _faulty
import _tasks
import psutil
import pytest
from _waiting import wait_for, wait_gone

import fastpool
from fastpool._runtime import _template

pytestmark = pytest.mark.faults

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fastpool_shm() -> list[str]:
    return [
        n for n in os.listdir("/dev/shm") if "fastpool" in n or n.startswith(("fp_", "fp-", "psm_"))
    ]


def _template_children() -> set[int]:
    pid = _template.template().pid
    if pid is None:
        return set()
    try:
        return {
            c.pid
            for c in psutil.Process(pid).children(recursive=True)
            if c.status() != psutil.STATUS_ZOMBIE
        }
    except psutil.NoSuchProcess:
        return set()


def test_fifty_create_use_close_cycles_leave_nothing():
    with fastpool.Pool(1) as p:  # the template exists before the baseline
        p.submit(_tasks.double, 1).result(timeout=30)
    fds, shm = _fds(), _fastpool_shm()
    for i in range(50):
        with fastpool.Pool(2) as p:
            arr = p.zeros(1000)
            assert p.submit(_tasks.double, i).result(timeout=30) == 2 * i
            assert list(p.map(_tasks.double, range(5))) == [0, 2, 4, 6, 8]
            del arr
    wait_for(lambda: not _template_children(), 10, "every worker to exit")  # no worker left
    assert _fds() == fds  # no fd left: boards, arenas, pidfds, sockets, pipes
    assert _fastpool_shm() == shm  # memfd: never a name in /dev/shm


def test_crashed_workers_leave_nothing_after_shutdown():
    fds = _fds()
    with fastpool.Pool(2, backoff_base_s=0.01) as p:
        for die in (_faulty.sigkill_self, _faulty.segfault, _faulty.hard_exit):
            with pytest.raises(fastpool.WorkerCrashed):
                p.submit(die).result(timeout=30)
        assert p.submit(_tasks.double, 2).result(timeout=30) == 4
    wait_for(lambda: not _template_children(), 10, "every worker to exit")
    assert _fds() == fds


_PARENT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import fastpool, _tasks
    from _waiting import wait_for
    from fastpool._runtime import _template
    if __name__ == "__main__":
        p = fastpool.Pool(2)
        keep = p.zeros(10**6)
        futs = [p.submit(_tasks.sleep_then, i, 60) for i in range(4)]
        wait_for(  # both busy, and both pids known (READY's hook can follow a first task)
            lambda: sum(bool(w["current_task"]) for w in p.stats()["workers"]) == 2
            and len(p.pids()) == 2,
            60,
            lambda: f"both workers busy: {{p.stats()}}, pids {{p.pids()}}",
        )
        print(_template.template().pid, *p.pids(), flush=True)
        time.sleep(120)  # until the test SIGKILLs this process
""")


@pytest.mark.linux
def test_parent_sigkilled_mid_work_leaves_no_process_and_no_segment(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(_PARENT.format(tests=TESTS_DIR))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert len(pids) == 3, line  # the template and two busy workers
        assert all(psutil.pid_exists(p) for p in pids)
        shm = _fastpool_shm()
        proc.kill()  # SIGKILL: no atexit, no finally, nothing runs in the parent
        proc.wait(10)
        wait_gone(pids, 10)  # template and workers are gone: reclaimed without a reaper
        assert _fastpool_shm() == shm
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


_CTRL_C = textwrap.dedent("""
    import os, sys, threading, time
    sys.path.insert(0, {tests!r})
    import fastpool, _tasks
    from _waiting import wait_for

    calling = threading.Event()

    def say_when_main_waits():
        # "waiting" once the main thread, past the line before fut.result(), sleeps:
        # the only place it can sleep from there is inside result() (compiled code
        # has no Python frame to look for)
        calling.wait()
        stat = f"/proc/self/task/{{threading.main_thread().native_id}}/stat"

        def sleeping():
            with open(stat) as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "S"

        wait_for(sleeping, 60, "the main thread to sleep in result()")
        print("waiting", flush=True)

    if __name__ == "__main__":
        with fastpool.Pool(1) as p:
            fut = p.submit(_tasks.sleep_then, 1, 60)
            threading.Thread(target=say_when_main_waits, daemon=True).start()
            try:
                calling.set()
                fut.result()
            except KeyboardInterrupt:
                print("interrupted", "running" if not fut.done() else "done", flush=True)
                p.shutdown(wait=False, cancel_futures=True)
                p.cancel(fut, force=True)
""")


def test_ctrl_c_interrupts_a_parent_waiting_on_a_result(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(_CTRL_C.format(tests=TESTS_DIR))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(signal.SIGINT)
        # seen while the 60 s task still runs: within a wait slice, not after the task
        said = proc.stdout.readline().split()
        if said != ["interrupted", "running"]:
            code = proc.wait(90)
            pytest.fail(f"the script said {said}, exit code {code}: {proc.stderr.read()}")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
