"""Each ``stats()`` counter says what it counts (issue 15, section 6): after a map
over 100 items a reader sees 100 items completed, not "completed: 0"."""

from __future__ import annotations

import _tasks
from conftest import make_pool


def test_a_map_over_100_items_counts_100_items_completed_and_no_call() -> None:
    with make_pool(2) as pool:
        assert list(pool.map(_tasks.double, range(100))) == [2 * i for i in range(100)]
        stats = pool.stats()
        assert stats["items_completed"] == 100
        assert stats["chunks_completed"] == stats["chunks_submitted"] >= 1
        assert stats["calls_submitted"] == stats["calls_completed"] == 0
        assert "completed" not in stats and "items" not in stats and "submitted" not in stats
        pool.submit(_tasks.double, 1).result(timeout=30)
        assert pool.stats()["calls_completed"] == 1
