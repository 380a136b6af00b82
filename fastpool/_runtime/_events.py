"""What the dispatcher tells supervision, and what supervision decides for a dead
worker's tasks: the typed words of the seam between them (no string tuples).

    SlotEvent(what, slot, detail)   dispatcher -> Supervisor.on_event, no lock held
    Fate                            Supervisor's judge -> Dispatcher.settle_death
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Happened(enum.IntEnum):
    """What a worker slot did that supervision must hear about."""

    READY = 1  # the worker took its K_INIT and serves (detail: its pid)
    INIT_FAILED = 2  # its initializer raised (detail: the encoded exception, or None)
    FIRST_REPLY = 3  # it answered a task for the first time since its spawn
    RETIRE = 4  # it reached max_tasks_per_worker, or was told to retire, and holds nothing
    CORRUPT = 5  # it broke its rings' format (detail: what was wrong)
    BAD_RESULT = 6  # a task's result could not be pickled in the worker (detail: the Task)


class SlotEvent(NamedTuple):
    what: Happened
    slot: int
    detail: Any = None


class Fate(enum.IntEnum):
    """What happens to one task of a dead worker (see Dispatcher.settle_death)."""

    REQUEUE = 1  # it never started: back to the front of the queue, same attempt
    RETRY = 2  # it ran and may run again (pure=True): the next attempt, at the front
    FAIL = 3  # it settles with the verdict's exception
    CANCEL = 4  # its caller cancelled it: it settles as cancelled
