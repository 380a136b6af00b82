"""Ordinary functions that run inside workers, importable by name under every start method.

Tasks that damage, kill or hang their own worker are in _faulty.py; tasks about
arrays (zero copy, the workers' NumPy hook) in _arrays.py.

Everything here lives at module level so a worker (fastpool's or ProcessPoolExecutor's,
fork, forkserver or spawn) unpickles it by reference: ``pythonpath = ["tests"]`` puts
this directory on ``sys.path`` and the workers inherit it.
"""

from __future__ import annotations

import copyreg
import os
import threading
import time
from typing import Any

# numpy and logging are imported where used: a worker imports this module on its first
# task, and some tests race that task against others.

# How long a task waits for the test's signal before it gives up, so a failed test
# never strands a worker.
LIMIT_S = 30.0


def double(x: Any) -> Any:
    return x * 2


def add(a: Any, b: Any = 0) -> Any:
    return a + b


def inc(x: int) -> int:
    return x + 1


def sum_of(*args: Any) -> Any:
    return sum(args)


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def identity(x: Any) -> Any:
    return x


def type_name(x: Any) -> str:
    """The type the worker received: what a map's transport must not change."""
    return type(x).__name__


def pid(_: Any = None) -> int:
    """This worker's pid; the argument, if any, is ignored (for map)."""
    return os.getpid()


def pid_and(x: Any) -> tuple[int, Any]:
    return (os.getpid(), x)


def where() -> tuple[int, int]:
    """(pid, thread id) of the caller: which process and thread ran the task."""
    return os.getpid(), threading.get_ident()


def sleep_then(x: Any, s: float) -> Any:
    time.sleep(s)
    return x


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


def wait_for_file(path: str, limit_s: float = LIMIT_S) -> bool:
    """Polls (in the worker) until ``path`` exists; False once ``limit_s`` passes, so a
    failed test never strands a worker.  The test creates the file: a gate it opens."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def open_gate(path: str, limit_s: float = LIMIT_S) -> None:
    """``wait_for_file``, raising TimeoutError if the gate was never opened."""
    if not wait_for_file(path, limit_s):
        raise TimeoutError(f"gate {path} was never opened")


def touch(path: str) -> str:
    """A side effect a test can see: the file exists only if this task ran."""
    with open(path, "w") as f:
        f.write("ran")
    return path


def note_pid(path: str) -> None:
    """Writes this process's pid to ``path`` (an initializer that says it ran, and where)."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))


def gate(path: str, value: Any = None, limit_s: float = LIMIT_S) -> tuple[Any, float]:
    """Holds its worker until ``path`` exists (or ``limit_s`` passes, so a failed
    test never strands a worker); returns (value, CLOCK_MONOTONIC at release).

    A file, not a sleep: the test decides when the task ends, so "still running"
    and "finished before X" are facts rather than timing guesses.  The monotonic
    clock is system-wide on Linux, so the parent can compare the stamp."""
    open_gate(path, limit_s)
    return value, time.monotonic()


def meet(directory: str, n: int, limit_s: float = LIMIT_S) -> int:
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


# ---- tasks held on a gate the test opens --------------------------------------------


def announce_then_gate(started: str, path: str, nbytes: int = 0, limit_s: float = LIMIT_S) -> str:
    """Creates ``started`` (the task is running: its record has left the task ring),
    then holds its worker until ``path`` exists (at most limit_s); returns
    ``"p" * nbytes``, a result as large as asked for from a small call."""
    touch(started)
    open_gate(path, limit_s)
    return "p" * nbytes


def gated(value: Any, started: str, path: str) -> Any:
    """Touches ``started``, waits for the gate ``path``, returns value."""
    touch(started)
    open_gate(path)
    return value


def gated_pid(path: str) -> int:
    open_gate(path)
    return os.getpid()


def held_first(x: int, path: str) -> int:
    """x * 2; item 0 waits for the gate ``path`` first (an ordered map's head chunk held)."""
    if x == 0:
        open_gate(path)
    return x * 2


def first_free(x: int, path: str) -> int:
    """x * 2 at once for item 0; every other item waits for the gate ``path`` first."""
    if x != 0:
        open_gate(path)
    return x * 2


def gate_or_expire(path: str, expired: str, limit_s: float) -> str:
    """Holds its worker until ``path`` exists; after limit_s it creates ``expired``
    and returns: the file says a task ran to its end rather than being stopped."""
    if wait_for_file(path, limit_s):
        return "opened"
    touch(expired)
    return "expired"


def cooperative(seconds: float, started: str | None = None) -> str:
    """Touches ``started`` (if given), then runs for ``seconds`` unless
    fastpool.cancelled() says stop first."""
    import fastpool

    if started is not None:
        touch(started)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if fastpool.cancelled():
            return "stopped early"
        time.sleep(0.005)
    return "ran to the end"


# ---- long map items that show where the map engine put them (issue 31) ------------------


def hand_on(i: int, directory: str, n: int, long_s: float, limit_s: float = 10.0) -> tuple:
    """Item ``i`` of a map of ``n`` long items: marks itself started, runs ``long_s``
    (what makes it long: the engine measures items by their run time), then holds its
    worker until item ``i + 1`` has started (the last item does not wait).  Returns
    (i, pid, whether item i + 1 started within ``limit_s``).

    Item i + 1 can only start on another worker while item i holds this one, so a map
    returns True everywhere only if no two consecutive items shared a chunk or one
    waited in a busy worker's queue while the other worker was free.  A map that fails
    it says so in its results, after ``limit_s`` once: the first item that gives up
    leaves a ``stalled`` file, and the items after it no longer wait (None: not checked)."""
    open(os.path.join(directory, f"started-{i}"), "w").close()
    time.sleep(long_s)
    stalled = os.path.join(directory, "stalled")
    if i == n - 1:
        return i, os.getpid(), True
    if os.path.exists(stalled):
        return i, os.getpid(), None
    deadline = time.monotonic() + limit_s
    while not os.path.exists(os.path.join(directory, f"started-{i + 1}")):
        if time.monotonic() > deadline or os.path.exists(stalled):
            open(stalled, "w").close()
            return i, os.getpid(), False
        time.sleep(0.002)
    return i, os.getpid(), True


def star_hand_on(args: tuple) -> tuple:
    """``hand_on(*args)``: for maps of one iterable."""
    return hand_on(*args)


def held_until_the_rest_ran(i: int, directory: str, n: int, long_s: float) -> tuple:
    """Item ``i`` of a map of ``n`` long items: item 0 holds its worker until items 1
    to n - 1 have all ended (at most 10 s), the others run ``long_s`` and mark
    themselves ended.  Returns (i, pid, whether item 0 saw the rest end).  With two
    workers the rest can only run on the other one: a map whose engine gives that
    worker more only when the consumer has taken item 0 stalls."""
    if i:
        time.sleep(long_s)
        open(os.path.join(directory, f"ended-{i}"), "w").close()
        return i, os.getpid(), True
    deadline = time.monotonic() + 10.0
    while len(os.listdir(directory)) < n - 1:
        if time.monotonic() > deadline:
            return i, os.getpid(), False
        time.sleep(0.002)
    return i, os.getpid(), True


# ---- side effects a test can count (issue 9: no task runs twice) ---------------------


def append_id(path: str, i: int) -> int:
    """Appends ``i`` and a newline to ``path`` in one O_APPEND write (atomic between
    processes for a line this short), then returns i: each run of the task leaves one
    line, so a task run twice shows up twice."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i


def appended_ids(path: str) -> list[int]:
    """The ids ``append_id`` wrote to ``path``, in write order ([] before the first)."""
    try:
        with open(path) as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


def append_id_padded(path: str, i: int, pad: Any) -> list:
    """``append_id``, returning [i, pad]: records as large as the caller wants on
    both rings (see test_deaths_under_load: a ring that emptied at a small offset
    holds one record until its reader catches up)."""
    append_id(path, i)
    return [i, pad]


def nbytes_of(data: bytes) -> bytes:
    """len(data), and a bytes result of that length back: a record of that size each way."""
    return bytes(len(data))


# ---- state a worker keeps between tasks ----------------------------------------------

_STATE: list[Any] = ["unset"]


def set_state(value: Any) -> None:
    """An initializer: what get_state returns in this worker."""
    _STATE[0] = value


def get_state(_: Any = None) -> Any:
    return _STATE[0]


# ---- coroutines ----------------------------------------------------------------------


async def async_task(x: int) -> int:
    import asyncio

    await asyncio.sleep(0.01)
    return x + 1


async def async_failing_child() -> None:
    import asyncio

    async def child() -> None:
        raise KeyError("from a child task")

    await asyncio.gather(asyncio.create_task(child()))


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


class CustomError(Exception):
    """An exception of the test's own type, with arguments: it must come back as itself."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)
        self.code = code


def raise_custom(code: int) -> None:
    raise CustomError(code, "raised on purpose")


def raise_serialization_error(x: int) -> int:
    """Raises fastpool's SerializationError as the task's own exception (what a nested
    pool raises to the task): it must come back as itself, not as a pickling failure.
    Item 3 alone raises, for the maps."""
    if x == 3:
        import fastpool

        raise fastpool.SerializationError(f"item {x}", "raised by the task")
    return x


def raise_unpicklable_exception(msg: str, kind: str = "lock") -> None:
    """Raises an exception that cannot come back as itself: one holding a lock
    (pickling fails) or one whose __init__ breaks the round trip (unpickling fails)."""
    if kind == "lock":
        raise LockedError(msg)
    raise TwoArgError(msg, 7)


def _reduce_with_traceback(exc: BaseException) -> tuple:
    """A reducer like tblib's (which importing Dask installs): it pickles the traceback,
    here as one nested tuple per frame, as deep as the traceback is long."""
    frames: Any = ()
    tb = exc.__traceback__
    while tb is not None:
        frames = (tb.tb_frame.f_code.co_name, (frames,))
        tb = tb.tb_next
    return (_rebuild_recursion_error, (exc.args, frames))


def _rebuild_recursion_error(args: tuple, _frames: Any) -> RecursionError:
    return RecursionError(*args)


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


def overflow_the_stack_with_a_traceback_reducer() -> None:
    """Overflows the stack (a real RecursionError, ~1,000 frames of traceback) in a
    worker whose copyreg pickles an exception's traceback: its pickle recurses past the
    limit too."""
    copyreg.pickle(RecursionError, _reduce_with_traceback)
    _recurse(0)


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


# ---- logging and BLAS inside a worker (the template tests) ---------------------------


def log_lines(n: int, width: int = 200) -> int:
    """Logs n lines through whatever handlers the root logger has in this worker."""
    import logging

    log = logging.getLogger("fastpool-test.task")
    for i in range(n):
        log.info("%d %s", i, "x" * width)
    return os.getpid()


def root_handler_count() -> int:
    import logging

    return len(logging.getLogger().handlers)


def blas_matmul(n: int) -> float:
    import numpy as np

    a = np.ones((n, n))
    return float((a @ a)[0, 0])


# ---- objectives and likelihoods that SciPy and emcee run in workers ------------------


def rosen(x: Any) -> float:
    """The Rosenbrock function, with an ill-conditioned valley: the optimisers' usual test."""
    import numpy as np

    x = np.asarray(x)
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def bumps(x: Any, scale: float = 1.0) -> float:
    """Several local minima, for brute force on a grid."""
    import numpy as np

    x = np.asarray(x)
    return float(scale * np.sum(np.sin(3 * x) + 0.1 * x**2))


def vector_integrand(t: float) -> Any:
    """A vector-valued integrand for quad_vec: t**k for k = 0..4."""
    import numpy as np

    return t ** np.arange(5)


def log_prob_gauss(theta: Any, ivar: Any) -> float:
    """log-density of an axis-aligned Gaussian with inverse variances ivar."""
    import numpy as np

    return float(-0.5 * np.sum(ivar * np.asarray(theta) ** 2))


def fails_below_zero(x: Any) -> float:
    if x[0] < 0:
        raise ValueError(f"negative input {x[0]}")
    return float(x[0])


class Dummy:
    """A result a weakref can watch (CPython's test_free_reference)."""

    def __init__(self, i: int) -> None:
        self.i = i


def make_dummy(i: int) -> Dummy:
    return Dummy(i)


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


def mp_identity() -> tuple[bool, str, int | None]:
    """(whether this worker had multiprocessing.process before this call, the name
    multiprocessing gives this process, its parent process's pid)."""
    import sys

    before = "multiprocessing.process" in sys.modules
    import multiprocessing

    parent = multiprocessing.parent_process()
    return before, multiprocessing.current_process().name, parent.pid if parent else None


def call_with(holder: dict, x: Any) -> Any:
    """``holder["fn"][0](x)``: a function that crossed inside an argument."""
    return holder["fn"][0](x)


def gated_noting_sigint(noted: str, started: str, path: str) -> int:
    """``gated``, noting in the file ``noted`` any SIGINT the worker receives meanwhile (the
    handler returns, so the task goes on): fastpool.mp's terminate() must send none."""
    import signal

    signal.signal(signal.SIGINT, lambda *_: touch(noted))
    touch(started)
    open_gate(path)
    return os.getpid()
