"""What a worker's death means for the tasks it held: the facts, the victim, each task's fate.

Functions of explicit data (no process, no lock, no slot state): the Supervisor gathers
the facts, calls these, and carries out the slot's side (restart, respawn, telemetry).

    death_facts(...)        the facts of one death (exit status, kill, memory, OOM evidence)
    corrupt_fates(...)      a worker that damaged shared memory: every task it held fails
    victim_of(...)          the one task the death hit, if any (the victim rule below)
    victim_fate(...)        that task's fate once the verdict is known
"""

from __future__ import annotations

import signal
from typing import Any

from fastpool import errors
from fastpool._runtime._events import Fate
from fastpool._supervision import _memory, _verdict
from fastpool._supervision._verdict import Cause, Kill

# The worker loop's own exits, taken between tasks (fastpool/_runtime/_serve.pyx):
# a result that found no room, a damaged task ring, a damaged arena region.
EXITS_BETWEEN_TASKS = frozenset((5, 6, 7))

FateOf = tuple[Any, Fate, "BaseException | None"]


def requeue_all(tasks: list[Any]) -> list[FateOf]:
    """Tasks that never started: all back to the front of the queue."""
    return [(t, Fate.REQUEUE, None) for t in tasks]


def requeue_held(
    tasks: list[Any], slot: int, pid: int, exitcode: int | None, follow: bool
) -> list[FateOf]:
    """Tasks a dead worker held that never started: back to the front of the queue.

    A call addressed to this worker (``Pool.run_on_workers``) never runs on another: it
    fails with WorkerCrashed, since the state it was sent to read died with the worker;
    ``follow`` (a worker retired by ``max_tasks_per_worker``) sends it to the slot's
    replacement instead."""
    return [
        (t, Fate.REQUEUE, None)
        if follow or not t.pin
        else (
            t,
            Fate.FAIL,
            errors.WorkerCrashed(
                slot,
                pid,
                exitcode,
                t.id,
                "the call was addressed to this worker (Pool.run_on_workers), had not "
                "started, and does not run on its replacement",
            ),
        )
        for t in tasks
    ]


def corrupt_fates(tasks: list[Any], slot: int, pid: int, detail: str | None) -> list[FateOf]:
    """A worker killed for damaging shared memory: its ring and slot words are not to be
    trusted, so which of its tasks ran cannot be known; none runs again, each fails."""
    return [
        (
            t,
            Fate.FAIL,
            errors.SegmentCorrupt(
                f"task {t.id} was held by worker {slot} (pid {pid}), which damaged "
                f"the pool's shared memory ({detail}); the worker was killed and replaced"
            ),
        )
        for t in tasks
    ]


def dropped_fates(tasks: list[Any], slot: int, pid: int, detail: str) -> list[FateOf]:
    """Tasks a worker held but had not started when Pool.terminate_workers()/kill_workers()
    stopped it: the pool is going away, so they fail rather than run on a replacement."""
    return [
        (
            t,
            Fate.FAIL,
            errors.BrokenPool(
                f"task {t.id} was held by worker {slot} (pid {pid}) when {detail}; it never "
                "started and does not run"
            ),
        )
        for t in tasks
    ]


def victim_of(
    tasks: list[Any], current: int, kill: Kill | None, exitcode: int | None, stopping: bool
) -> Any:
    """The task the death hit: the one the board names as running, or else, for a death
    nobody asked for outside the worker loop's own exits between tasks, the oldest held."""
    victim = next((t for t in tasks if t.wire == current), None)
    if victim is None and kill is not None and kill.wire:
        # a kill aimed at a held task while the worker's word named none (a task that
        # zeroed it and hung): that task, never a requeue that would hang again
        victim = next((t for t in tasks if t.wire == kill.wire), None)
    if victim is None and tasks and kill is None and not stopping:
        if exitcode not in EXITS_BETWEEN_TASKS:
            # `current` is a word the task itself can overwrite: the oldest task held
            # (the only one that can have started) is judged, so a non-pure task that
            # scribbled `current` never runs again.
            victim = tasks[0]
    return victim


def task_facts(task: Any) -> _verdict.TaskFacts:
    return _verdict.TaskFacts(
        id=task.id,
        wire=task.wire,
        fn_name=task.fn_name,
        args=task.describe_args(),  # facts from submit: a dead task's bytes never run here
        options=task.options,
        attempts=task.attempt,
        transferred=task.transferred,
    )


def victim_fate(
    victim: Any,
    death: _verdict.Death,
    cause: Cause,
    detail: str,
    facts: _verdict.TaskFacts,
    result: str | None,
) -> FateOf:
    """The judged task's fate: cancelled if its caller asked, retried if the verdict
    allows, else failed with the verdict's exception."""
    if victim.cancel_requested:
        return (victim, Fate.CANCEL, None)
    if result == "retry":
        return (victim, Fate.RETRY, None)
    return (
        victim,
        Fate.FAIL,
        _verdict.exception_for(death, cause, detail, facts, result or "fail"),
    )


def death_facts(
    *,
    slot: int,
    pid: int,
    exitcode: int | None,
    kill: Kill | None,
    starting: bool,
    init_error: BaseException | None,
    mem: _memory.WorkerMemory | None,
    cg: dict | None,
    oom_before: int | None,
    memory_limit: int | None,
    age_s: float,
    served: int,
) -> _verdict.Death:
    """The facts of one death; an unasked SIGKILL is checked against the worker's
    cgroup OOM counter (read now, compared with ``oom_before``)."""
    sampled = mem is not None and bool(mem.samples)
    current = mem.current_bytes if sampled and mem is not None else None
    confirmed, evidence = False, ""
    if exitcode == -signal.SIGKILL and kill is None:
        after = _memory.oom_kill_count(cg) if cg else None
        confirmed, evidence = _memory.judge_sigkill(
            oom_before, after, current, cgroup_limit(cg) or memory_limit, False
        )
    limit = memory_limit
    if confirmed:
        limit = cgroup_limit(cg) or limit
    return _verdict.Death(
        slot=slot,
        pid=pid,
        exitcode=exitcode,
        kill=kill,
        starting=starting,
        init_error=init_error,
        oom_confirmed=confirmed,
        oom_evidence=evidence,
        memory=_verdict.MemoryFacts(
            limit, current, mem.peak_bytes if sampled and mem is not None else None
        ),
        age_s=age_s,
        served=served,
    )


def cgroup_limit(cg: dict | None) -> int | None:
    """The memory limit of one cgroup (v2 memory.max or v1 memory.limit_in_bytes)."""
    if not cg:
        return None
    for key, name in (("v2", "memory.max"), ("v1_memory", "memory.limit_in_bytes")):
        path = cg.get(key)
        if path is not None:
            try:
                value = int((path / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if value < 1 << 60:
                return value
    return None
