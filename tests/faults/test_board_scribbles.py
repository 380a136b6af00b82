"""A task that damages the shared board costs its own worker's tasks, never the parent.

Every worker maps the whole board read-write and runs arbitrary code, so a task
(through ctypes or a buggy C extension) can write anything into its rings, its
slot words and the board header.  The parent keeps its own copy of the geometry
and of each side's position, reads every word a worker can write once and
checks it: a damaged ring fails that worker's tasks with SegmentCorrupt, the
worker is killed and replaced, and the pool goes on serving.  Nothing crashes
or hangs the parent.
"""

from __future__ import annotations

import random

import _faulty
import _tasks
import pytest
from conftest import make_pool

import fastpool
from fastpool import errors

pytestmark = pytest.mark.faults

SETTLE_S = 30
TARGETS = [
    "result_tail",
    "result_head",
    "task_head",
    "task_tail",
    "result_record",
    "slot_current",
    "slot_served",
    "slot_skips",
    "board_nslots",
    "board_capacity",
]
ADVERSARIAL = [0, 1 << 20, 1 << 63, (1 << 64) - 4096]  # zero, huge, sign bit, wraps on the next add
# What a task on the damaged worker may legitimately get instead of its result.
DAMAGE = (errors.SegmentCorrupt, errors.WorkerCrashed)


def _settle_all(futs: list) -> list:
    """Waits for every future (none may hang) and returns each outcome."""
    out = []
    for f in futs:
        try:
            out.append(f.result(timeout=SETTLE_S))
        except DAMAGE as exc:
            out.append(exc)
    return out


def _still_serves(pool: fastpool.Pool) -> None:
    futs = [pool.submit(_tasks.double, i) for i in range(40)]
    assert [f.result(timeout=SETTLE_S) for f in futs] == [2 * i for i in range(40)]


@pytest.mark.parametrize("target", TARGETS)
def test_scribbling_over_shared_words_costs_only_its_worker(target: str) -> None:
    with make_pool(2, backoff_base_s=0.01) as pool:
        _still_serves(pool)
        for value in ADVERSARIAL + [random.Random(target).getrandbits(64) for _ in range(2)]:
            futs = [pool.submit(_faulty.scribble, target, value)]
            futs += [pool.submit(_tasks.double, i) for i in range(30)]
            outcomes = _settle_all(futs)
            for i, got in enumerate(outcomes[1:]):
                assert got == 2 * i or isinstance(got, DAMAGE), (target, value, got)
            _still_serves(pool)
        if target.startswith("board_"):
            # The header only matters to a worker that attaches: kill both workers, so
            # their replacements attach over whatever the scribbler left there.
            for _ in range(2):
                doomed = pool.submit(_faulty.sigkill_self)
                with pytest.raises(fastpool.WorkerCrashed):
                    doomed.result(timeout=SETTLE_S)
            _still_serves(pool)
        stats = pool.stats()
        assert stats["inflight"] == 0 and stats["queued"] == 0


def test_a_corrupt_result_ring_fails_that_workers_tasks_with_segment_corrupt() -> None:
    with make_pool(1, backoff_base_s=0.01) as pool:
        _still_serves(pool)
        # the task holds its worker after the damage, so only the parent can end it
        bad = pool.submit(_faulty.scribble, "result_tail", 1 << 63, SETTLE_S)
        with pytest.raises(errors.SegmentCorrupt) as info:
            bad.result(timeout=SETTLE_S)
        assert "damaged the pool's shared memory" in str(info.value)
        rec = pool.stats()["crashes"][-1]
        assert rec["cause"] == "corrupt" and rec["by_fastpool"]
        assert pool.stats()["corrupt"] == 1
        _still_serves(pool)


def test_a_task_that_zeroes_its_current_word_and_hangs_still_times_out() -> None:
    # The word says "no task" while the slot holds one and nothing comes back: the
    # parent times the task it gave that worker, not the word.
    with make_pool(1, task_timeout=0.5, backoff_base_s=0.01) as pool:
        _still_serves(pool)
        bad = pool.submit(_faulty.scribble, "slot_current", 0, 600)
        with pytest.raises(errors.TaskTimeout):
            bad.result(timeout=SETTLE_S)
        _still_serves(pool)
        assert pool.stats()["crashes"][-1]["cause"] == "timeout"


# ---- the parent decides from its own state (issue 15, section 7) --------------------


@pytest.mark.parametrize("value", [1, (1 << 32) - 1])
def test_the_board_headers_old_want_word_cannot_stall_the_collector(value: int) -> None:
    import concurrent.futures
    import threading

    with make_pool(2) as pool:
        assert pool.submit(_faulty.scribble, "board_want", value).result(timeout=SETTLE_S)
        called = threading.Event()
        futs = [pool.submit(_tasks.double, i) for i in range(20)]
        futs[-1].add_done_callback(lambda _f: called.set())
        # Nobody drives from this thread: only the collector can settle these.
        done, pending = concurrent.futures.wait(futs, timeout=SETTLE_S)
        assert not pending and called.wait(SETTLE_S)
        assert [f.result() for f in futs] == [2 * i for i in range(20)]


@pytest.mark.parametrize("value", [0, 12345, (1 << 64) - 1])
def test_a_task_that_scribbles_its_current_word_and_dies_runs_once(tmp_path, value) -> None:
    from fastpool._runtime import _serve
    from fastpool._supervision import _deaths

    assert _deaths.EXITS_BETWEEN_TASKS == {
        _serve.EXIT_RESULT_STUCK,
        _serve.EXIT_TASK_RING_CORRUPT,
        _serve.EXIT_ARENA_CORRUPT,
    }
    path = str(tmp_path / "runs")
    with make_pool(1, backoff_base_s=0.01) as pool:
        doomed = pool.submit(_faulty.append_id_scribble_current_then_die, path, 7, value)
        behind = [pool.submit(_faulty.append_id, path, i) for i in range(3)]
        with pytest.raises(fastpool.WorkerCrashed):
            doomed.result(timeout=SETTLE_S)
        assert [f.result(timeout=SETTLE_S) for f in behind] == [0, 1, 2]
    with open(path) as f:
        runs = f.read().split()
    assert runs.count("7") == 1 and sorted(runs) == ["0", "1", "2", "7"]
