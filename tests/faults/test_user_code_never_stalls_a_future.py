"""User code that runs in the parent (unpickling a result, a done-callback) cannot
leave a future RUNNING or end the thread that settles futures (issue 15, section 2).

Every way a future ends goes through the dispatcher's one settle function, and it
is the one place that catches what user code raises, BaseException included."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import wait

import _tasks
import pytest
from conftest import make_pool

from fastpool import errors

SETTLE_S = 30.0


def test_a_result_whose_unpickling_raises_system_exit_fails_only_its_future() -> None:
    with make_pool(1) as pool:
        fut = pool.submit(_tasks.return_exits_when_unpickled)
        with pytest.raises(errors.SerializationError) as info:
            fut.result(timeout=SETTLE_S)  # the thread that waits is the one that unpickles
        assert isinstance(info.value.__cause__, SystemExit)
        assert fut.done()
        assert pool.submit(_tasks.double, 21).result(timeout=SETTLE_S) == 42


def test_the_collector_survives_a_result_whose_unpickling_raises_system_exit() -> None:
    with make_pool(1) as pool:
        bad = pool.submit(_tasks.return_exits_when_unpickled)
        # concurrent.futures.wait drives nothing: the collector thread settles both
        done, _ = wait([bad], timeout=SETTLE_S)
        assert done == {bad}
        assert isinstance(bad.exception(), errors.SerializationError)
        after = pool.submit(_tasks.double, 21)
        assert wait([after], timeout=SETTLE_S).done == {after}
        assert after.result() == 42


@pytest.mark.parametrize("raised", [SystemExit("from a callback"), ValueError("from a callback")])
def test_a_callback_that_raises_is_logged_and_the_next_one_runs(
    raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    ran = threading.Event()

    def bad_callback(_f: object) -> None:
        raise raised

    with make_pool(1) as pool:
        with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
            fut = pool.submit(_tasks.double, 1)
            fut.add_done_callback(bad_callback)
            fut.add_done_callback(lambda _f: ran.set())
            later = pool.submit(_tasks.double, 2)
            # settled by the collector thread, which must outlive the callback
            assert wait([fut, later], timeout=SETTLE_S).not_done == set()
            assert ran.wait(SETTLE_S)
            after = pool.submit(_tasks.double, 21)
            assert wait([after], timeout=SETTLE_S).done == {after}
        assert fut.result() == 2 and after.result() == 42
        assert any(
            r.name == "concurrent.futures" and "exception calling callback for" in r.getMessage()
            for r in caplog.records
        ), caplog.text


@pytest.mark.parametrize("driver", ["collector", "caller"])
def test_a_callback_may_wait_on_another_future_of_the_same_pool(driver: str) -> None:
    got: list[object] = []
    with make_pool(2) as pool:
        second = pool.submit(_tasks.sleep_then, "second", 0.2)
        first = pool.submit(_tasks.double, 1)
        first.add_done_callback(lambda _f: got.append(second.result()))
        if driver == "caller":
            first.result(timeout=SETTLE_S)  # this thread settles first and runs the callback
        assert wait([first, second], timeout=SETTLE_S).not_done == set()
    assert got == ["second"]


def test_a_callback_of_a_future_failed_by_teardown_may_wait_on_another_one() -> None:
    """Teardown fails every future still in flight: their states change first, then
    their callbacks run, so one callback can wait for another future of the batch."""
    seen: list[object] = []
    with make_pool(2) as pool:
        first = pool.submit(_tasks.sleep_then, 1, SETTLE_S)
        second = pool.submit(_tasks.sleep_then, 2, SETTLE_S)
        first.add_done_callback(lambda _f: seen.append(type(second.exception())))
        _tasks_running(pool, 2)
        # what Ctrl-C's teardown does: workers stopped, the tasks they held abandoned
        pool._rt.teardown(grace_s=0.1)
        assert wait([first, second], timeout=SETTLE_S).not_done == set()
    assert seen == [errors.BrokenPool]


def _tasks_running(pool: object, n: int) -> None:
    from _waiting import wait_for

    wait_for(lambda: sum(1 for w in pool.stats()["workers"] if w["current_task"]) >= n)
