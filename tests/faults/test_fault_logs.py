"""What users read when things fail (issue 9, section 8).

Each death is logged on the ``fastpool`` logger as one readable sentence -- what
died, why, which task, what happens next -- at ERROR for a real crash and at
WARNING for a kill fastpool made on purpose (timeout, hang, memory limit, forced
cancel).  No raw dict reaches the log; the record lives in ``stats()["crashes"]``.
``stats()`` counts calls and map chunks apart, and kills apart from crashes.
"""

from __future__ import annotations

import logging
import re

import pytest
from _faulty import allocate_mib, sigkill_self, sigstop_self, spin_forever
from _tasks import double, double_non_negative
from _waiting import wait_workers_ready

import fastpool

pytestmark = [pytest.mark.faults, pytest.mark.linux]


def _fastpool_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fastpool"]


def _one_sentence(caplog, level: int, *words: str) -> str:
    """The one fastpool record of the test: at level, one line, no dict, naming words."""
    recs = _fastpool_records(caplog)
    assert len(recs) == 1 and recs[0].levelno == level, [
        (r.levelname, r.getMessage()) for r in recs
    ]
    text = recs[0].getMessage()
    assert "\n" not in text and "{" not in text and "'time'" not in text, text
    assert text.startswith("fastpool: worker ") and text.endswith("."), text
    for w in words:
        assert w in text, (w, text)
    return text


def test_a_crash_is_one_sentence_at_error(caplog):
    with fastpool.Pool(1, backoff_base_s=0.01) as pool:
        wait_workers_ready(pool)
        with caplog.at_level(logging.DEBUG, logger="fastpool"):
            fut = pool.submit(sigkill_self)
            with pytest.raises(fastpool.WorkerCrashed):
                fut.result(timeout=30)
        task_id = pool.stats()["crashes"][-1]["task_id"]
        text = _one_sentence(
            caplog,
            logging.ERROR,
            "SIGKILL",
            f"task {task_id}",
            "sigkill_self",
            "its future fails",
            "replacement",
        )
        assert re.search(r"\(pid \d+\)", text)
        stats = pool.stats()
        assert (stats["crashed"], stats["killed"]) == (1, 0)
        assert stats["crashes"][-1]["cause"] == "died" and not stats["crashes"][-1]["by_fastpool"]


@pytest.mark.parametrize("case", ["timeout", "hung", "memory"])
def test_a_kill_fastpool_made_is_one_sentence_at_warning_and_counted_as_killed(caplog, case):
    options = {
        "timeout": dict(task_timeout=0.3),
        "hung": dict(hang_timeout=0.3),
        "memory": dict(memory_limit="200MiB", memory_interval_s=0.02),
    }[case]
    task, args, exc, words = {
        "timeout": (spin_forever, (), fastpool.TaskTimeout, ("past its timeout of 0.3 s",)),
        "hung": (sigstop_self, (), fastpool.WorkerHung, ("stopped beating",)),
        "memory": (
            allocate_mib,
            (600,),
            fastpool.WorkerMemoryError,
            ("over memory_limit", "200.0 MiB"),
        ),
    }[case]
    with fastpool.Pool(1, backoff_base_s=0.01, **options) as pool:
        wait_workers_ready(pool)
        with caplog.at_level(logging.DEBUG, logger="fastpool"):
            with pytest.raises(exc):
                pool.submit(task, *args).result(timeout=60)
        _one_sentence(caplog, logging.WARNING, task.__name__, "a replacement starts now", *words)
        assert pool.submit(double, 2).result(timeout=30) == 4  # replaced
        stats = pool.stats()
        assert (stats["killed"], stats["crashed"]) == (1, 0)
        rec = stats["crashes"][-1]
        assert rec["cause"] == {"timeout": "timeout", "hung": "hung", "memory": "memory"}[case]
        assert rec["by_fastpool"]


def test_stats_count_map_chunks_apart_from_calls():
    with fastpool.Pool(2) as pool:
        assert pool.submit(double, 1).result(timeout=30) == 2
        before = pool.stats()
        assert list(pool.map(double, range(100))) == [2 * i for i in range(100)]
        after = pool.stats()
        assert (
            after["calls_submitted"] == before["calls_submitted"] == 1
        )  # the one call, not the map
        assert after["calls_completed"] == before["calls_completed"] == 1
        chunks = after["chunks_submitted"] - before["chunks_submitted"]
        assert chunks > 1 and after["chunks_completed"] - before["chunks_completed"] == chunks
        assert after["items_completed"] - before["items_completed"] == 100


def test_stats_count_a_chunk_whose_function_raised_as_failed():
    with fastpool.Pool(1) as pool:
        with pytest.raises(ValueError, match="item -1 is negative"):
            list(pool.map(double_non_negative, [1, 2, -1, 3], chunksize=2))
        stats = pool.stats()
        assert (stats["calls_submitted"], stats["calls_failed"], stats["chunks_submitted"]) == (
            0,
            0,
            2,
        )
        assert (stats["chunks_completed"], stats["chunks_failed"]) == (
            1,
            1,
        )  # today: (2, 0), items 4
