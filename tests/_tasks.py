"""Functions that run inside workers, importable by name under every start method.

Everything here lives at module level so a worker (fastpool's or ProcessPoolExecutor's,
fork, forkserver or spawn) unpickles it by reference: ``pythonpath = ["tests"]`` puts
this directory on ``sys.path`` and the workers inherit it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any


def double(x: Any) -> Any:
    return x * 2


def add(a: Any, b: Any) -> Any:
    return a + b


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def identity(x: Any) -> Any:
    return x


def pid() -> int:
    return os.getpid()


def sleep_then(x: Any, s: float) -> Any:
    time.sleep(s)
    return x


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def raise_value_error(msg: str) -> None:
    raise ValueError(msg)


def double_non_negative(x: int) -> int:
    if x < 0:
        raise ValueError(f"item {x} is negative")
    return x * 2


def fail_at(x: int, bad: int) -> int:
    """x * 2, but ValueError for the one item ``bad``: map's error position."""
    if x == bad:
        raise ValueError(f"item {x} is bad")
    return x * 2


def gate(path: str, value: Any = None, limit_s: float = 30.0) -> tuple[Any, float]:
    """Holds its worker until ``path`` exists (or ``limit_s`` passes, so a failed
    test never strands a worker); returns (value, CLOCK_MONOTONIC at release).

    A file, not a sleep: the test decides when the task ends, so "still running"
    and "finished before X" are facts rather than timing guesses.  The monotonic
    clock is system-wide on Linux, so the parent can compare the stamp."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.005)
    return value, time.monotonic()


def meet(directory: str, n: int, limit_s: float = 30.0) -> int:
    """A barrier across workers: registers this process in ``directory`` and holds
    it until ``n`` distinct processes have registered; returns this pid.

    ``n`` tasks that all call this can only finish on ``n`` different workers, so
    a test that needs every worker to run something waits for that, not for luck
    in the dispatcher.  Fails after ``limit_s`` so a broken test strands nobody."""
    open(os.path.join(directory, str(os.getpid())), "w").close()
    deadline = time.monotonic() + limit_s
    while len(os.listdir(directory)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {os.listdir(directory)} of {n} workers met in {directory}")
        time.sleep(0.005)
    return os.getpid()


def touch_then_sleep(path: str, value: Any, s: float) -> Any:
    """Creates ``path`` (the test's sign that the task is running), then sleeps ``s``."""
    open(path, "w").close()
    time.sleep(s)
    return value


# ---- results and exceptions that cannot cross back ---------------------------------


def return_unpicklable(kind: str = "lambda") -> Any:
    """A result plain pickle refuses: a lambda (no importable name) or a lock."""
    if kind == "lambda":
        return lambda: None
    return threading.Lock()


class LockedError(Exception):
    """Holds a lock: pickling it fails in the worker."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.lock = threading.Lock()


class TwoArgError(Exception):
    """Pickles, but cannot be rebuilt: args holds one value, __init__ needs two."""

    def __init__(self, msg: str, code: int) -> None:
        super().__init__(f"{msg} (code {code})")
        self.code = code


def raise_unpicklable_exception(msg: str, kind: str = "lock") -> None:
    """Raises an exception that cannot come back as itself: one holding a lock
    (pickling fails) or one whose __init__ breaks the round trip (unpickling fails)."""
    if kind == "lock":
        raise LockedError(msg)
    raise TwoArgError(msg, 7)


# ---- reentrancy: submitting from done-callbacks -------------------------------------


class Chain:
    """Each done-callback submits the next step: add(previous result, 1), ``steps`` times.

    ``done`` is set when the last step settles; ``errors`` collects what a callback
    raised (Future swallows callback exceptions, so the test reads them here)."""

    def __init__(self, executor: Any, steps: int) -> None:
        self.executor = executor
        self.left = steps
        self.done = threading.Event()
        self.value: Any = None
        self.errors: list[BaseException] = []

    def start(self) -> None:
        self.executor.submit(add, 0, 1).add_done_callback(self.step)

    def step(self, fut: Any) -> None:
        try:
            self.value = fut.result()
            self.left -= 1
            if self.left == 0:
                self.done.set()
                return
            self.executor.submit(add, self.value, 1).add_done_callback(self.step)
        except BaseException as exc:  # noqa: BLE001 - reported through .errors
            self.errors.append(exc)
            self.done.set()


def submit_from_callback(executor: Any, n: int, out: list, errors: list) -> Any:
    """A done-callback that submits ``n`` doubles and stores their futures in ``out``."""

    def callback(_fut: Any) -> None:
        try:
            for i in range(n):
                out.append(executor.submit(double, i))
        except BaseException as exc:  # noqa: BLE001 - reported through errors
            errors.append(exc)

    return callback


def scribble_arena_top() -> Any:
    """Overwrites this worker's arena region top with a wrapping value (as a stray
    write from a C extension could), then returns an array that needs that region."""
    import ctypes

    import numpy as np

    from fastpool._runtime import _codec

    arena = _codec._PROCESS_ARENA[0]
    ctypes.c_uint64.from_address(arena.base_address + 128 + 8 * arena.proc).value = 2**64 - 4096
    return np.ones(1 << 18)


# ---- payloads that do harm when they are unpickled (issue 15, sections 1 and 2) ----------


def raise_system_exit(msg: str) -> None:
    raise SystemExit(msg)


class ExitsWhenUnpickled:
    """Pickles fine; unpickling it raises SystemExit (a result the parent rebuilds)."""

    def __reduce__(self) -> Any:
        return (raise_system_exit, ("raised while the parent unpickled a result",))


def return_exits_when_unpickled() -> ExitsWhenUnpickled:
    return ExitsWhenUnpickled()


def c_exit(code: int) -> None:
    import ctypes

    ctypes.CDLL(None).exit(code)  # C exit(): atexit handlers run, no exception


class Harmful:
    """An argument whose unpickling kills the process that unpickles it: a segfault
    (ctypes.string_at(0)), os._exit(0), or C exit(0)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __reduce__(self) -> Any:
        import ctypes

        if self.how == "segfault":
            return (ctypes.string_at, (0,))
        if self.how == "os_exit":
            return (os._exit, (0,))
        return (c_exit, (0,))
