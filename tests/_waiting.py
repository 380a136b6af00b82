"""Waiting for an event with a deadline: what a test does instead of sleeping.

A sleep guesses how long something takes and is wrong both ways: too short on a
loaded machine (a flaky failure), too long everywhere else (a slow suite).  A test
waits for the thing itself -- a file the task writes, a state in ``stats()``, a
process gone -- and fails, naming what it waited for, only when a deadline far
beyond any plausible delay passes.
"""

from __future__ import annotations

import time
from typing import Callable, Generator, TypeVar

import psutil

T = TypeVar("T")

DEADLINE_S = 30.0
POLL_S = 0.005


def wait_for(
    predicate: Callable[[], T],
    timeout: float = DEADLINE_S,
    what: str | Callable[[], str] = "a condition",
    poll_s: float = POLL_S,
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Fails the test with AssertionError naming ``what`` (a string, or a callable
    called only then, to report state such as ``pool.stats()``) once ``timeout``
    seconds pass.  The predicate runs once more at the deadline, so a slow
    machine that gets there just in time still passes.  ``poll_s``: the pause
    between calls, longer for a predicate that is costly to evaluate.
    """
    polls = _polls(predicate, timeout, what)
    try:
        while True:
            next(polls)
            time.sleep(poll_s)
    except StopIteration as done:
        return done.value


async def until(
    predicate: Callable[[], T],
    what: str | Callable[[], str] = "a condition",
    timeout: float = DEADLINE_S,
) -> T:
    """``wait_for`` inside a coroutine: polls without blocking the event loop."""
    import asyncio

    polls = _polls(predicate, timeout, what)
    try:
        while True:
            next(polls)
            await asyncio.sleep(POLL_S)
    except StopIteration as done:
        return done.value


def _polls(
    predicate: Callable[[], T], timeout: float, what: str | Callable[[], str]
) -> Generator[None, None, T]:
    """The one polling loop: yields while the caller should pause, returns the
    predicate's truthy value, or raises AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            value = predicate()
            if value:
                return value
            detail = what() if callable(what) else what
            raise AssertionError(f"gave up after {timeout:g} s waiting for {detail}")
        yield


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process: a zombie has exited and counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: "list[int] | set[int]", timeout: float = DEADLINE_S) -> None:
    """Wait until none of ``pids`` is running (see ``running``)."""
    wait_for(
        lambda: not any(running(p) for p in pids),
        timeout,
        lambda: f"processes to exit: {sorted(p for p in pids if running(p))} still running",
    )


def wait_workers_ready(pool, n: int | None = None, timeout: float = DEADLINE_S) -> list[int]:
    """Wait until ``n`` (default: all) of ``pool``'s workers are started and idle-or-busy
    ("ready" with a pid); returns their pids.  Before that, the dispatcher may queue
    every task on the workers that happen to be up."""
    want = pool.workers if n is None else n

    def ready() -> list[int]:
        pids = [w["pid"] for w in pool.stats()["workers"] if w["state"] == "ready" and w["pid"]]
        return pids if len(pids) == want else []

    return wait_for(ready, timeout, lambda: f"{want} ready workers: {pool.stats()['workers']}")


def spy_select(sup) -> list:
    """Records the timeout of every select a pool's supervisor thread makes (``pool._sup``):
    None is a sleep until something wakes it."""
    timeouts: list = []
    real = sup.sel.select

    def select(timeout=None):
        timeouts.append(timeout)
        return real(timeout)

    sup.sel.select = select
    return timeouts


def live_blocks(pool) -> int:
    """Arena blocks someone references now, in any process of the pool."""
    return pool._arena.usage()["live_blocks"]


def wait_live_blocks(pool, baseline: int) -> None:
    """Waits until the pool's live arena blocks are back to ``baseline``: what a call,
    a result or a dead worker held was released."""
    wait_for(
        lambda: live_blocks(pool) == baseline,
        what=lambda: f"live_blocks back to {baseline} (now {live_blocks(pool)})",
    )
