"""A worker's death, judged: its cause, the exception its task gets, the record
kept and the sentence logged.  Pure functions of the facts; no processes.

    Death (slot, pid, exit code, fastpool's kill if any, OOM evidence, memory)
      + the task it held (if any)
      -> cause_of()      Cause: a crash, or one of fastpool's own verdicts
      -> outcome()       retry once (pure=True), fail, or poison
      -> exception_for() the exception on the task's future
      -> record()        the crash record kept in stats()["crashes"]
      -> sentence()      one readable log line, at WARNING for fastpool's own kills
"""

from __future__ import annotations

import enum
import logging
import signal
import time
from concurrent.futures import CancelledError
from typing import Any, NamedTuple

from fastpool import errors
from fastpool._supervision import _policy


class Cause(enum.Enum):
    """Why a worker went away."""

    CRASHED = "died"  # a signal or exit nobody asked for
    INIT = "init"  # the initializer raised, or the worker died while starting
    OOM_KILLER = "oom-killer"  # the kernel's OOM killer, confirmed by the cgroup counter
    CORRUPT = "corrupt"  # it broke the shared segment's format; fastpool killed it
    START_TIMEOUT = "start-timeout"  # it never said READY within start_timeout
    SPAWN_FAILED = "spawn-failed"  # the template could not fork it
    TIMEOUT = "timeout"  # fastpool killed it: its task ran past its timeout
    HUNG = "hung"  # fastpool killed it: no heartbeat for hang_timeout
    MEMORY = "memory"  # fastpool killed it: over memory_limit
    CANCELLED = "cancelled"  # fastpool killed it: pool.cancel(force=True)
    COLLATERAL = "collateral"  # a kill meant for a task that had just finished
    STOPPED = "stop"  # shutdown
    TERMINATED = "terminated"  # fastpool signalled it: Pool.terminate_workers()/kill_workers()
    RETIRED = "retire"  # max_tasks_per_worker or leak_threshold

    @property
    def verdict(self) -> bool:
        """fastpool stopped a healthy worker for its task's sake: not a slot failure
        (six slow tasks in a row must not open the breaker)."""
        return self in _VERDICTS

    @property
    def planned(self) -> bool:
        return self in (Cause.STOPPED, Cause.RETIRED)

    @property
    def by_fastpool(self) -> bool:
        """fastpool sent the signal (counted as a kill in stats, not a crash)."""
        return self in _VERDICTS or self in (Cause.CORRUPT, Cause.START_TIMEOUT, Cause.TERMINATED)


_VERDICTS = frozenset((Cause.TIMEOUT, Cause.HUNG, Cause.MEMORY, Cause.CANCELLED, Cause.COLLATERAL))


class Kill(NamedTuple):
    """fastpool's reason for signalling (or stopping) a worker."""

    cause: Cause
    wire: int | None = None  # the attempt of the task the kill was aimed at
    detail: str = ""


class MemoryFacts(NamedTuple):
    limit_bytes: int | None = None
    owned_bytes: int | None = None  # last sample of what the worker owns
    peak_bytes: int | None = None


class Death(NamedTuple):
    slot: int
    pid: int
    exitcode: int | None
    kill: Kill | None = None
    starting: bool = False  # it never said READY
    init_error: BaseException | None = None
    oom_confirmed: bool = False
    oom_evidence: str = ""
    memory: MemoryFacts = MemoryFacts()
    age_s: float = 0.0
    served: int = 0


class TaskFacts(NamedTuple):
    id: int
    wire: int
    fn_name: str
    args: str  # argument shapes, never data
    options: _policy.TaskOptions | None = None
    attempts: int = 0
    transferred: bool = False


def cause_of(death: Death, victim: TaskFacts | None) -> tuple[Cause, str]:
    """The cause and its detail.  A kill aimed at a task that finished just before
    it landed makes the task that had just started collateral, not the culprit."""
    kill = death.kill
    if kill is not None:
        if kill.cause.planned:
            return kill.cause, kill.detail
        if kill.wire is not None and victim is not None and victim.wire != kill.wire:
            return Cause.COLLATERAL, (
                f"killed by fastpool to stop task {kill.wire >> 3} ({kill.cause.value}), which "
                "finished just before; this task had just started"
            )
        return kill.cause, kill.detail
    if death.exitcode == -signal.SIGKILL and death.oom_confirmed:
        return Cause.OOM_KILLER, death.oom_evidence
    if death.init_error is not None or death.starting:
        return Cause.INIT, repr(death.init_error) if death.init_error is not None else ""
    return Cause.CRASHED, ""


def outcome(cause: Cause, task: TaskFacts) -> str:
    """ "retry", "fail" or "poison".  fastpool's own kills are verdicts on the task,
    never retried; a crash retries a pure task once."""
    if (cause.verdict and cause is not Cause.COLLATERAL) or cause is Cause.TERMINATED:
        return "fail"  # TERMINATED: the pool is going away, nothing runs again
    if task.options is None:
        return "fail"
    return _policy.crash_outcome(task.options, task.attempts + 1, task.transferred)


def exception_for(
    death: Death, cause: Cause, detail: str, task: TaskFacts, result: str
) -> BaseException:
    """The exception the task's future gets."""
    what = detail or f"function {task.fn_name}({task.args})"
    if cause is Cause.TIMEOUT:
        return errors.TaskTimeout(task.id, float(detail or 0), death.slot)
    if cause is Cause.CANCELLED:
        return CancelledError(f"task {task.id} was cancelled; its worker was killed and replaced")
    if cause is Cause.HUNG:
        return errors.WorkerHung(death.slot, death.pid, death.exitcode, task.id, detail)
    if cause in (Cause.MEMORY, Cause.OOM_KILLER):
        mem = death.memory
        return errors.WorkerMemoryError(
            death.slot,
            death.pid,
            death.exitcode,
            task.id,
            f"function {task.fn_name}({task.args})",
            reason="memory-limit" if cause is Cause.MEMORY else "oom-killer",
            limit_bytes=mem.limit_bytes,
            rss_bytes=mem.owned_bytes,
            peak_rss_bytes=mem.peak_bytes,
        )
    if cause is Cause.CORRUPT:
        return errors.SegmentCorrupt(
            f"worker {death.slot} (pid {death.pid}) running task {task.id} "
            f"damaged the pool's shared memory ({detail}); it was killed and "
            "replaced"
        )
    exc: BaseException = errors.WorkerCrashed(death.slot, death.pid, death.exitcode, task.id, what)
    if result == "poison":
        exc = errors.PoisonTask(death.slot, death.pid, death.exitcode, task.id, what)
    return exc


def record(
    death: Death, cause: Cause, detail: str, task: TaskFacts | None, result: str | None
) -> dict[str, Any]:
    """The crash record kept in ``stats()["crashes"]`` (plain data, JSON-able)."""
    rec: dict[str, Any] = dict(
        time=time.time(),
        slot=death.slot,
        pid=death.pid,
        cause=cause.value,
        exitcode=death.exitcode,
        signal=errors.signal_name(death.exitcode),
        task_id=task.id if task else None,
        function=task.fn_name if task else None,
        args=task.args if task else None,
        worker_age_s=round(death.age_s, 3),
        tasks_served=death.served,
        detail=detail,
        by_fastpool=cause.by_fastpool,
    )
    if death.oom_evidence:
        rec["evidence"] = death.oom_evidence
    if result is not None:
        rec["task_outcome"] = result
    return rec


_NEXT = {
    "retry": "it will run once more on a fresh worker",
    "fail": "its future fails",
    "poison": "it killed a worker before, so its future fails (PoisonTask)",
}


def sentence(
    death: Death,
    cause: Cause,
    detail: str,
    task: TaskFacts | None,
    result: str | None,
    restart: str,
) -> tuple[int, str]:
    """(logging level, one readable sentence): what died, why, which task, what next.

    WARNING for what fastpool did on purpose, ERROR for real crashes."""
    how = {
        Cause.CRASHED: f"died ({_exit_text(death.exitcode)})",
        Cause.INIT: (
            f"failed while starting ({_exit_text(death.exitcode)}{'; ' + detail if detail else ''})"
        ),
        Cause.OOM_KILLER: "was killed by the kernel's OOM killer",
        Cause.CORRUPT: f"was killed because it damaged the pool's shared memory ({detail})",
        Cause.START_TIMEOUT: f"was killed because it did not start in time ({detail})",
        Cause.SPAWN_FAILED: f"could not be started ({detail})",
        Cause.TIMEOUT: f"was killed because its task ran past its timeout of {detail} s",
        Cause.HUNG: f"was killed because it stopped beating ({detail})",
        Cause.MEMORY: f"was killed because it went over memory_limit ({detail})",
        Cause.CANCELLED: "was killed to cancel its task (pool.cancel(force=True))",
        Cause.COLLATERAL: f"was killed by fastpool ({detail})",
        Cause.STOPPED: "was stopped",
        Cause.TERMINATED: f"was stopped at once ({detail})",
        Cause.RETIRED: "was retired",
    }[cause]
    who = f"fastpool: worker {death.slot} (pid {death.pid}) {how}"
    if task is not None:
        who += f" while running task {task.id} ({task.fn_name})"
        if result is not None:
            who += f"; {_NEXT[result]}"
    level = logging.WARNING if cause.by_fastpool or cause.planned else logging.ERROR
    return level, f"{who}; {restart}."


def _exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        return f"killed by {errors.signal_name(exitcode)}"
    return f"exit code {exitcode}"
