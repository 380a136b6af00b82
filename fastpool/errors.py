"""The exceptions fastpool raises, and which situation raises each.

Every class inherits what callers of ``concurrent.futures`` already catch
(``BrokenProcessPool``, ``TimeoutError``, ``RuntimeError``...), keeps its facts in
attributes, and pickles (it crosses process boundaries), whatever its
constructor's signature: ``FastPoolError.__reduce__`` rebuilds from ``__dict__``.

    FastPoolError(Exception)
    +-- BrokenPool(FastPoolError, BrokenProcessPool)
    |   +-- WorkerCrashed            .worker_id .pid .exitcode .signal_name .task_id .cause
    |   |                            __cause__: how the process ended (see WorkerCrashed)
    |   |   +-- PoisonTask           the task killed a second worker after a retry
    |   |   +-- WorkerHung           heartbeat stopped
    |   |   +-- WorkerMemoryError    memory limit or kernel OOM kill (also a MemoryError)
    |   +-- InitializerError         the initializer raised or exited
    +-- TaskTimeout(FastPoolError)                 not a TimeoutError: see its docstring
    +-- CircuitOpen(FastPoolError, RuntimeError)   .retry_after_s .last_cause
    +-- PoolClosed(FastPoolError, RuntimeError)
    +-- QueueFull(FastPoolError, queue.Full)
    +-- SerializationError(FastPoolError, pickle.PicklingError)
    +-- RemoteError(FastPoolError)                 an exception that could not be pickled
    +-- DetachedBufferError(FastPoolError, ValueError)
    +-- SharedMemoryError(FastPoolError, MemoryError)
    +-- SegmentCorrupt(FastPoolError)              a worker wrote over the pool's shared memory
        +-- RegionCorrupt                          .region .slot .offset .detail: an arena region

The BrokenPool family is made the first time one of its names is read (see
``_make_broken_family``): its stdlib base costs more to import than the rest of
fastpool. ``import fastpool`` therefore does not import ``concurrent.futures.process``.

Stdlib only: this module sits under everything else, ``_core`` included.
"""

from __future__ import annotations

import pickle
import queue
import signal
import threading
from typing import Any

__all__ = [
    "FastPoolError",
    "BrokenPool",
    "WorkerCrashed",
    "PoisonTask",
    "WorkerHung",
    "WorkerMemoryError",
    "InitializerError",
    "TaskTimeout",
    "CircuitOpen",
    "PoolClosed",
    "QueueFull",
    "SerializationError",
    "RemoteError",
    "DetachedBufferError",
    "SharedMemoryError",
    "SegmentCorrupt",
    "RegionCorrupt",
    "signal_name",
]


def _restore(cls: type, args: tuple, state: dict) -> BaseException:
    # Every class keeps its positional constructor arguments in args; keyword-only
    # facts travel in state.  cls.__new__ alone would pick RuntimeError's __new__ for
    # classes that also derive from TimeoutError (an OSError), which CPython refuses.
    try:
        exc = cls(*args)
    except TypeError:
        exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


# What WorkerCrashed says of a SIGKILL: a guess, since no one can tell who sent it (the
# demo, whose task sends its own, names the sender instead).
_SIGKILL_HINT = "SIGKILL that fastpool did not send is often the kernel's OOM killer"


def signal_name(exitcode: int | None) -> str | None:
    """``-9`` -> ``"SIGKILL"``; None for a normal exit or an unknown code."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


class FastPoolError(Exception):
    """Base class of every error fastpool raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("__traceback__",)}
        return (_restore, (type(self), self.args, state))


def _size(n: int | None, other: int | None = None) -> str:
    """MiB with one decimal; exact bytes when that would print two close sizes alike."""
    if n is None:
        return "an unknown amount (never sampled)"
    text = f"{n / 2**20:.1f} MiB"
    if other is not None and text == f"{other / 2**20:.1f} MiB":
        text = f"{n:,} bytes"
    return text


class TaskTimeout(FastPoolError):
    """The task ran past its timeout; its worker was killed and replaced.

    Deliberately not a ``TimeoutError``: ``future.result(timeout=...)`` raises
    ``TimeoutError`` when the task is still running and may yet succeed, while
    this means the task failed for good.  ``except TimeoutError`` therefore
    means "not yet", and ``except fastpool.TaskTimeout`` "never"."""

    def __init__(self, task_id: int | None, timeout_s: float, worker_id: int | None = None) -> None:
        super().__init__(task_id, timeout_s, worker_id)
        self.task_id = task_id
        self.timeout_s = timeout_s
        self.worker_id = worker_id

    def __str__(self) -> str:
        return (
            f"task {self.task_id} ran longer than its timeout of {self.timeout_s:g} s; its "
            f"worker {self.worker_id} was killed and replaced"
        )


class CircuitOpen(FastPoolError, RuntimeError):
    """Every worker slot's breaker is open: the pool fails fast instead of crash-looping."""

    def __init__(self, retry_after_s: float, last_cause: str = "") -> None:
        super().__init__(retry_after_s, last_cause)
        self.retry_after_s = retry_after_s
        self.last_cause = last_cause

    def __str__(self) -> str:
        return (
            f"every worker failed repeatedly, so the pool stopped restarting them; it will "
            f"try again in {self.retry_after_s:.1f} s. Last failure: {self.last_cause or '?'}"
        )


class PoolClosed(FastPoolError, RuntimeError):
    """The pool was shut down (or is draining) and takes no new work."""

    def __init__(
        self, message: str = "cannot schedule new tasks after the pool was shut down"
    ) -> None:
        super().__init__(message)


class QueueFull(FastPoolError, queue.Full):
    """The pool's queue is at ``max_queue`` and ``submit`` was told not to wait."""

    def __init__(self, max_queue: int, timeout_s: float | None = None) -> None:
        super().__init__(max_queue, timeout_s)
        self.max_queue = max_queue
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        waited = "" if not self.timeout_s else f" after waiting {self.timeout_s:g} s"
        return (
            f"the pool's queue is full ({self.max_queue} tasks){waited}; wait for results "
            f"before submitting more, or raise max_queue"
        )


class SerializationError(FastPoolError, pickle.PicklingError):
    """An argument or a result could not be pickled (or unpickled) to cross processes."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(what, reason)
        self.what = what
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.what} could not cross to another process: {self.reason}"


class RemoteError(FastPoolError):
    """A task raised an exception that could not be pickled; this carries what it said."""

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        super().__init__(type_name, message, traceback_text)
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message} (the exception itself could not be pickled)"


class DetachedBufferError(FastPoolError, ValueError):
    """The array was handed to a task with ``fastpool.transfer``; this handle is dead."""


class SharedMemoryError(FastPoolError, MemoryError):
    """Shared memory could not be had for a request; the message says how much is free."""


class SegmentCorrupt(FastPoolError):
    """A worker wrote over the pool's shared memory, or a segment's magic or layout
    version did not match on attach; the message says which segment and what was read.

    Raised on the futures of the tasks that the damage costs (the affected worker's)
    and by attach; the pool itself goes on. RegionCorrupt narrows it to one arena region."""


# --- the BrokenPool family, made on first use ---------------------------------------
#
# BrokenPool must be a concurrent.futures.process.BrokenProcessPool, and that module
# imports multiprocessing.connection, tempfile, subprocess and socket: about 20 ms,
# more than the rest of `import fastpool`. A base is fixed when
# its class statement runs, so the six classes below are made the first time one of
# them is named (PEP 562 module __getattr__): when a worker dies, or when a caller
# writes `except fastpool.WorkerCrashed` or `from fastpool.errors import BrokenPool`.
# They are made once, under a lock, and kept in this module's globals, so every
# later lookup (pickle's by-name lookup of ``fastpool.errors.WorkerCrashed`` in
# another process included) finds the same class objects.

_BROKEN_FAMILY = (
    "BrokenPool",
    "WorkerCrashed",
    "PoisonTask",
    "WorkerHung",
    "WorkerMemoryError",
    "InitializerError",
)
_family_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name in _BROKEN_FAMILY:
        with _family_lock:
            if name not in globals():
                globals().update(_make_broken_family())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_BROKEN_FAMILY))


def _make_broken_family() -> dict[str, type]:
    from concurrent.futures import process

    # ProcessPoolExecutor's own class for text from (or about) a worker, which Python 3.15
    # makes the __cause__ of a BrokenProcessPool (gh-139462): code that reads that cause's
    # .tb reads a WorkerCrashed's the same way.  A private name, of the same shape in
    # 3.11-3.15; should a later Python drop it, a crash has no cause (the suite says so).
    remote_traceback = getattr(process, "_RemoteTraceback", None)

    class BrokenPool(FastPoolError, process.BrokenProcessPool):
        """The pool could not run a task because a worker process failed."""

    class WorkerCrashed(BrokenPool):
        """The worker died while it held this task (signal, ``os._exit``, segfault, OOM kill).

        Only the task the worker was running fails; the pool replaces the worker and
        goes on. ``exitcode`` follows ``multiprocessing``: negative means killed by
        that signal (``signal_name`` spells it). Its ``__cause__`` says how the process
        ended, as ``ProcessPoolExecutor`` says it from Python 3.15 on, and in its class
        (``concurrent.futures.process._RemoteTraceback``), on every Python: ``.tb`` reads
        ``Process 4242 (fastpool worker 1) terminated abruptly with exit code -9 (SIGKILL)``.
        """

        cause = "died"

        def __init__(
            self,
            worker_id: int,
            pid: int | None,
            exitcode: int | None,
            task_id: int | None = None,
            detail: str = "",
        ) -> None:
            super().__init__(worker_id, pid, exitcode, task_id, detail)
            self.worker_id = worker_id
            self.pid = pid
            self.exitcode = exitcode
            self.task_id = task_id
            self.detail = detail
            # set here, not where the death is judged: a copy pickled to another process
            # is rebuilt through __init__ and carries it too
            self.__cause__ = self._ending()

        def _ending(self) -> BaseException | None:
            """How the process ended, in ProcessPoolExecutor's (3.15) words and class."""
            if remote_traceback is None:
                return None
            if self.exitcode is None:
                how = "; its exit status is unknown"
            else:
                how = f" with exit code {self.exitcode}"
                if self.exitcode < 0:
                    how += f" ({self.signal_name})"
            return remote_traceback(
                f"\n'''\nProcess {self.pid} (fastpool worker {self.worker_id}) terminated "
                f"abruptly{how}'''"
            )

        @property
        def signal_name(self) -> str | None:
            return signal_name(self.exitcode)

        def _how(self) -> str:
            if self.exitcode is None:
                return "with an unknown exit status"
            if self.exitcode < 0:
                return f"of {self.signal_name}"
            return f"with exit code {self.exitcode}"

        def __str__(self) -> str:
            msg = (
                f"worker {self.worker_id} (pid {self.pid}) died {self._how()} while running "
                f"task {self.task_id}"
            )
            if self.exitcode == -signal.SIGKILL:
                msg += f"; {_SIGKILL_HINT}"
            if self.exitcode == -signal.SIGSEGV:
                msg += "; a segfault is a bug in native code called by the task"
            if self.detail:
                msg += f"; {self.detail}"
            return msg

    class PoisonTask(WorkerCrashed):
        """A task retried once (``pure=True``) killed a second worker; it is not retried again."""

        cause = "poison"

        def __str__(self) -> str:
            return "poison task: it killed two workers; " + super().__str__()

    class WorkerHung(WorkerCrashed):
        """The worker's heartbeat stopped (SIGSTOP, a C call holding the GIL); it was killed.

        Not a TimeoutError, like TaskTimeout (see there)."""

        cause = "hung"

        def __str__(self) -> str:
            return (
                f"worker {self.worker_id} (pid {self.pid}) stopped beating while running task "
                f"{self.task_id} and was killed; {self.detail}"
            ).rstrip("; ")

    class WorkerMemoryError(WorkerCrashed, MemoryError):
        """The worker was killed for memory: over ``memory_limit`` or by the kernel's OOM killer.

        ``reason`` is ``"memory-limit"`` or ``"oom-killer"``; ``limit_bytes``,
        ``rss_bytes`` (last sample) and ``peak_rss_bytes`` say what was seen.
        """

        cause = "memory"

        def __init__(
            self,
            worker_id: int,
            pid: int | None,
            exitcode: int | None,
            task_id: int | None = None,
            detail: str = "",
            *,
            reason: str = "memory-limit",
            limit_bytes: int | None = None,
            rss_bytes: int | None = None,
            peak_rss_bytes: int | None = None,
        ) -> None:
            super().__init__(worker_id, pid, exitcode, task_id, detail)
            self.reason = reason
            self.limit_bytes = limit_bytes
            self.rss_bytes = rss_bytes
            self.peak_rss_bytes = peak_rss_bytes

        def __str__(self) -> str:
            limit = self.limit_bytes
            peak = self.peak_rss_bytes if self.peak_rss_bytes is not None else self.rss_bytes
            if self.reason == "oom-killer":
                msg = (
                    f"worker {self.worker_id} (pid {self.pid}) running task {self.task_id} "
                    "was killed by the kernel's OOM killer "
                    f"(its cgroup's limit: {_size(limit)}); the worker owned "
                    f"{_size(peak)} at its largest sample"
                )
            else:
                msg = (
                    f"worker {self.worker_id} (pid {self.pid}) running task {self.task_id} "
                    f"was killed by fastpool: it owned {_size(peak, limit)}, "
                    f"over memory_limit {_size(limit, peak)}"
                )
            return msg + (f"; {self.detail}" if self.detail else "")

    class InitializerError(BrokenPool):
        """The pool's ``initializer`` raised or exited in a worker; the slot backs off."""

        def __init__(self, message: str, worker_id: int | None = None) -> None:
            super().__init__(message, worker_id)
            self.message = message
            self.worker_id = worker_id

        def __str__(self) -> str:
            return self.message

    family = {
        cls.__name__: cls
        for cls in (
            BrokenPool,
            WorkerCrashed,
            PoisonTask,
            WorkerHung,
            WorkerMemoryError,
            InitializerError,
        )
    }
    for cls in family.values():
        cls.__qualname__ = cls.__name__  # pickle and tracebacks: fastpool.errors.WorkerCrashed
    return family


class RegionCorrupt(SegmentCorrupt):
    """A block chain in the shared arena is damaged: some process wrote over its headers.

    ``region`` is the arena region (0: the parent, 1 + s: worker slot s), ``slot``
    that worker slot (None for the parent), ``offset`` where in the region the
    chain broke and ``detail`` what was read there.  Every worker maps the arena
    read-write, so the culprit is usually, not always, the region's own process."""

    def __init__(self, region: int, detail: str, offset: int = 0) -> None:
        super().__init__(region, detail, offset)  # kept in .args, so it pickles
        self.region, self.detail, self.offset = region, detail, offset
        self.slot = region - 1 if region > 0 else None

    def __str__(self) -> str:
        who = "the parent" if self.region == 0 else f"worker slot {self.slot}"
        return (
            f"shared arena region {self.region} ({who}) is corrupt at +{self.offset}: "
            f"{self.detail}; a task wrote over the arena's block headers (every worker maps "
            "them), so that region's blocks can no "
            "longer be walked"
        )
