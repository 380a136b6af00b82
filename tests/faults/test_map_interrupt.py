"""Ctrl-C ("interrupt kernel") while a map is consumed drops the chunks no worker started,
also those a worker already held, so the next cell's task does not wait behind them
(issue 15, section 5). The interrupt is a real SIGINT to this process."""

from __future__ import annotations

import os
import signal
import threading
import time

import _map_interrupt_tasks as tasks
import pytest

import fastpool

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("kind", ["map", "imap_unordered"])
def test_ctrl_c_during_a_map_leaves_no_unstarted_chunk_running(kind, tmp_path):
    log, started, gate = (str(tmp_path / n) for n in ("log", "started", "gate"))
    n = 12
    with fastpool.Pool(1) as pool:
        pool.submit(os.getpid).result(timeout=60)  # the worker is up: chunks get held

        def interrupt() -> None:
            while not os.path.exists(started):
                time.sleep(0.005)
            os.kill(os.getpid(), signal.SIGINT)

        killer = threading.Thread(target=interrupt)
        killer.start()
        run = pool.map if kind == "map" else pool.imap_unordered
        args = [(i, log, started, gate) for i in range(n)]
        with pytest.raises(KeyboardInterrupt):
            for _ in (
                run(tasks.logged, *zip(*args), chunksize=1)
                if kind == "map"
                else run(_star, args, chunksize=1)
            ):
                pass
        killer.join()
        open(gate, "w").close()
        assert pool.submit(os.getpid).result(timeout=60) > 0  # the next cell's task
    with open(log) as f:
        ran = [int(x) for x in f.read().split()]
    assert ran == [0], ran  # item 0 was running; nothing after it ran


def _star(a):
    return tasks.logged(*a)
