"""A reply for a task nobody owns (late, after a timeout or a crash-and-replace) is dropped."""

import _faulty
import _tasks
from _waiting import wait_for

import fastpool


def test_reply_with_an_unknown_task_id_is_dropped_and_nothing_breaks():
    with fastpool.Pool(1) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        # The worker publishes a reply for a task the parent never gave it, then its own.
        assert p.submit(_faulty.send_stale_reply, 987654321 << 3).result(timeout=30) is True
        wait_for(lambda: p.stats()["unknown_replies"] == 1, 10, "the stale reply to be counted")
        futs = [p.submit(_tasks.double, i) for i in range(20)]
        assert [f.result(timeout=30) for f in futs] == [2 * i for i in range(20)]
        assert p.stats()["crashed"] == 0 and p.stats()["calls_completed"] == 22
        assert p.stats()["unknown_replies"] == 1


def test_an_unknown_reply_does_not_hand_an_idle_worker_out_twice():
    with fastpool.Pool(1) as p:
        assert p.submit(_tasks.double, 1).result(timeout=30) == 2
        assert p.submit(_faulty.send_stale_reply, 987654322 << 3).result(timeout=30) is True
        wait_for(lambda: p.stats()["unknown_replies"] == 1, 10, "the stale reply to be counted")
        # the idle stack holds each slot at most once: two tasks at once still run one at a time
        # on the single worker, and the slot's count of tasks answered is exact
        futs = [p.submit(_tasks.sleep_then, i, 0.01) for i in range(4)]
        assert [f.result(timeout=30) for f in futs] == [0, 1, 2, 3]
        assert p.stats()["workers"][0]["served"] == 6
