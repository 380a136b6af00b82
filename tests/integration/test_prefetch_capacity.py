"""A busy worker is handed a full prefetch behind the task it runs.

The dispatcher lets a worker hold up to ``stats()["prefetch"]`` tasks when tasks
are short, so the worker never waits for the parent between them.  The task ring
(64 MiB by default) must take them: today it takes one or two, because a ring
that emptied at a small offset restarts at 0 and holds one record until the
worker reads it (tests/unit/test_ring_capacity.py has the ring-level case).
"""

from __future__ import annotations

from _tasks import announce_then_gate, double
from _waiting import wait_for, wait_workers_ready

import fastpool


def test_a_busy_worker_is_handed_a_full_prefetch(tmp_path):
    started, opener = tmp_path / "started", tmp_path / "open"
    with fastpool.Pool(1) as pool:
        wait_workers_ready(pool)
        assert list(pool.map(double, range(64), chunksize=1)) == [2 * i for i in range(64)]
        depth = pool.stats()["prefetch"]
        assert depth == 16
        # Two lone round trips: the task ring is empty, its last record at offset 0.
        assert pool.submit(double, 1).result(timeout=30) == 2
        assert pool.submit(double, 2).result(timeout=30) == 4
        gate = pool.submit(announce_then_gate, str(started), str(opener))
        try:
            wait_for(started.exists, what="the gate task to start")
            futs = [pool.submit(double, i) for i in range(depth - 1)]
            assert pool.stats()["workers"][0]["assigned"] == depth  # today: about 4
        finally:
            opener.touch()
        assert gate.result(timeout=30) == ""
        assert [f.result(timeout=30) for f in futs] == [2 * i for i in range(depth - 1)]
