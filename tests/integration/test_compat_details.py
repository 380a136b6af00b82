"""Compatibility details with concurrent.futures users hit (issue 15, section 6): a worker
looks like a child process to multiprocessing; initargs with multiprocessing locks and queues
are refused with the alternative named; Python 3.14's terminate_workers()/kill_workers()."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from concurrent.futures import BrokenExecutor

import pytest

import fastpool


def _identity() -> tuple:
    proc = multiprocessing.current_process()
    parent = multiprocessing.parent_process()
    return proc.name, parent is not None and parent.pid, parent is not None and parent.is_alive()


def test_a_worker_looks_like_a_child_process_to_multiprocessing():
    with fastpool.Pool(1) as pool:
        name, parent_pid, alive = pool.submit(_identity).result(timeout=60)
    assert name != "MainProcess" and name.startswith("fastpool-worker-")
    assert parent_pid == os.getpid() and alive


@pytest.mark.parametrize("make", ["Lock", "Queue", "Event"])
def test_initargs_with_a_multiprocessing_lock_queue_or_event_is_a_clear_type_error(make):
    obj = getattr(multiprocessing, make)()
    with pytest.raises(TypeError, match=r"Manager\(\) proxy"):
        fastpool.Pool(1, initializer=print, initargs=(obj,))


def _set_global(value) -> None:
    global SEEN
    SEEN = value


def test_a_manager_proxy_in_initargs_works():
    with multiprocessing.Manager() as m:
        lock = m.Lock()
        with fastpool.Pool(1, initializer=_set_global, initargs=(lock,)) as pool:
            assert pool.submit(os.getpid).result(timeout=60) > 0


def _announce_then_sleep(path: str, s: float) -> float:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(s)
    return s


@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_terminate_and_kill_workers_stop_running_and_queued_work(method, tmp_path):
    pool = fastpool.Pool(1)
    marker = tmp_path / "started"
    running = pool.submit(_announce_then_sleep, str(marker), 60)
    queued = [pool.submit(time.sleep, 60) for _ in range(3)]
    while not marker.exists() or not marker.read_text():  # the task really runs
        time.sleep(0.01)
    pid = int(marker.read_text())
    getattr(pool, method)()
    with pytest.raises(BrokenExecutor):
        running.result(timeout=30)  # long before the 60 s task could end
    for f in queued:  # none runs its 60 s
        assert f.cancelled() or isinstance(f.exception(timeout=30), BrokenExecutor)
    with pytest.raises(RuntimeError):
        pool.submit(os.getpid)
    pool.shutdown(wait=True)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _mark(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))


@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_terminate_and_kill_workers_run_nothing_a_worker_had_prefetched(method, tmp_path):
    """Issue 23, defect 11: the tasks a worker held but had not started die with it; they
    are neither requeued nor run on a replacement (Python 3.14: they fail)."""
    pool = fastpool.Pool(1)
    for _ in range(40):  # short tasks: the worker gets to hold several (prefetch > 1)
        pool.submit(os.getpid).result(timeout=60)
    assert pool.stats()["prefetch"] >= 2
    started = tmp_path / "started"
    running = pool.submit(_announce_then_sleep, str(started), 60)
    held = [pool.submit(_mark, str(tmp_path / f"held-{i}")) for i in range(3)]
    while not started.exists() or not started.read_text():
        time.sleep(0.01)
    while pool.stats()["workers"][0]["assigned"] < 2:  # a task is prefetched behind it
        time.sleep(0.01)
    getattr(pool, method)()
    with pytest.raises(BrokenExecutor):
        running.result(timeout=30)
    for f in held:
        assert f.cancelled() or isinstance(f.exception(timeout=30), BrokenExecutor)
    pool.shutdown(wait=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["started"]  # none of them ran
    assert pool.stats()["crashed"] + pool.stats()["killed"] <= 1


def _put_wait_put(q, e) -> None:
    q.put("started")
    e.wait()
    q.put("finished")


@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_terminate_and_kill_workers_stop_a_task_waiting_on_a_manager_event(method):
    """CPython 3.14's own test_force_shutdown_workers, but for its look at
    executor._processes: a task waits on a Manager event (forkserver, 3.14's default) that
    is never set; the method stops it, the with block ends, nothing after the wait runs."""
    with multiprocessing.get_context("forkserver").Manager() as m:
        q, e = m.Queue(), m.Event()
        with fastpool.Pool(1) as pool:
            fut = pool.submit(_put_wait_put, q, e)
            assert q.get(timeout=60) == "started"
            pid = pool.pids()[0]
            getattr(pool, method)()
        with pytest.raises(BrokenExecutor):
            fut.result(timeout=0)
        with pytest.raises(queue.Empty):
            q.get(timeout=0.01)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
