"""A reply for a task nobody owns (late, after a timeout or a crash-and-replace) is dropped."""

import time

import _faulty
import fastpool
from fastpool import _codec


def test_reply_with_an_unknown_task_id_is_dropped_and_nothing_breaks():
    with fastpool.Pool(1) as p:
        assert p.submit(_faulty.double, 1).result(timeout=30) == 2
        # What a worker would publish for a task the parent no longer tracks.
        assert p._board.push_result(0, _codec.R_OK, 987654321, 0, _codec.dumps("stale"))
        end = time.monotonic() + 10
        while time.monotonic() < end and p.stats()["unknown_replies"] == 0:
            time.sleep(0.01)
        assert p.stats()["unknown_replies"] == 1
        futs = [p.submit(_faulty.double, i) for i in range(20)]
        assert [f.result(timeout=30) for f in futs] == [2 * i for i in range(20)]
        assert p.stats()["crashed"] == 0 and p.stats()["completed"] == 21


def test_an_unknown_reply_does_not_hand_an_idle_worker_out_twice():
    with fastpool.Pool(1) as p:
        assert p.submit(_faulty.double, 1).result(timeout=30) == 2
        assert p._board.push_result(0, _codec.R_OK, 987654322, 0, _codec.dumps("stale"))
        end = time.monotonic() + 10
        while time.monotonic() < end and p.stats()["unknown_replies"] == 0:
            time.sleep(0.01)
        assert p._idle.count(0) <= 1  # the idle stack holds each slot at most once
        assert p.stats()["workers"][0]["served"] == 1
