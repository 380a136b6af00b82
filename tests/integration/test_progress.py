"""Progress bars: map/imap_unordered(progress=...) and fastpool.progress(futures).

The claims: a bar counts finished items (not chunks, not consumed results), once
each, with any chunk size; its total comes from len() or __length_hint__ and is
None for a generator; an error in the middle closes it with the items that did
finish; tqdm is drawn through tqdm.auto; a missing tqdm names the extra.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import _tasks
import pytest
from _waiting import wait_for

import fastpool

N = 100


class Recorder:
    """A progress callable: every (done, total) it was told, thread-safe."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None]] = []
        self.lock = threading.Lock()

    def __call__(self, done: int, total: int | None) -> None:
        with self.lock:
            self.calls.append((done, total))

    @property
    def done(self) -> int:
        with self.lock:
            return self.calls[-1][0] if self.calls else 0


def _run(
    kind: str, pool: fastpool.Pool, fn: Callable[..., Any], items: Any, **kw: Any
) -> list[Any]:
    if kind == "map":
        return list(pool.map(fn, items, **kw))
    return sorted(pool.imap_unordered(fn, items, **kw))


@pytest.mark.parametrize("kind", ["map", "imap_unordered"])
@pytest.mark.parametrize("chunksize", [1, 3, 7, N, None])
def test_each_item_is_counted_once_whatever_the_chunk_size(
    pool: fastpool.Pool, kind: str, chunksize: int | None
) -> None:
    rec = Recorder()
    assert _run(kind, pool, _tasks.double, range(N), chunksize=chunksize, progress=rec) == [
        2 * i for i in range(N)
    ]
    dones = [d for d, _ in rec.calls]
    assert dones[-1] == N
    assert all(a < b for a, b in zip(dones, dones[1:])), dones  # counted once, in order
    assert {t for _, t in rec.calls} == {N}
    step = chunksize or N
    assert all(b - a <= step for a, b in zip([0] + dones, dones)), (
        dones
    )  # one update per chunk at most


def test_finished_items_count_before_the_consumer_reaches_them(
    pool: fastpool.Pool, tmp_path: Any
) -> None:
    gate = str(tmp_path / "gate")
    rec = Recorder()
    n = 2 * pool.workers + 2  # map's window: every chunk is submitted up front
    results = pool.map(_tasks.held_first, range(n), [gate] * n, chunksize=1, progress=rec)
    # item 0 holds the head of an ordered map: nothing can be yielded yet, but the
    # others finish (all but those prefetched behind it on its worker) and count
    wait_for(
        lambda: rec.done >= n // 2 and rec.done == pool.stats()["chunks_completed"],
        what=lambda: f"finished items counted: {rec.calls}, stats {pool.stats()}",
    )
    open(gate, "w").close()
    assert list(results) == [2 * i for i in range(n)]
    assert rec.calls[-1] == (n, n)


def test_a_generator_has_no_total_and_an_iterator_uses_its_length_hint(pool: fastpool.Pool) -> None:
    rec = Recorder()
    assert len(list(pool.map(_tasks.double, (i for i in range(N)), progress=rec))) == N
    assert rec.calls[-1] == (N, None)
    rec = Recorder()
    assert len(list(pool.imap_unordered(_tasks.double, iter(list(range(N))), progress=rec))) == N
    assert rec.calls[-1] == (N, N)  # list_iterator.__length_hint__
    rec = Recorder()
    assert len(list(pool.map(_tasks.add, range(N), range(40), progress=rec))) == 40
    assert rec.calls[-1] == (40, 40)  # the shortest input


def test_an_error_in_one_chunk_counts_its_items_before_the_error(pool: fastpool.Pool) -> None:
    rec = Recorder()
    with pytest.raises(ValueError, match="item 55 is bad"):
        list(pool.map(_tasks.fail_at, range(N), [55] * N, chunksize=N, progress=rec))
    assert rec.calls == [(55, N)]  # the failed chunk's partial results


def test_an_error_in_the_middle_closes_the_bar_with_what_finished(pool: fastpool.Pool) -> None:
    rec = Recorder()
    with pytest.raises(ValueError, match="item 55 is bad"):
        list(pool.map(_tasks.fail_at, range(N), [55] * N, chunksize=10, progress=rec))
    done = rec.done
    # chunks 0-4 (50 items) and the 5 before the failure in chunk 5; chunks after it
    # count 10 each if they finished before the map raised
    assert done >= 55 and (done - 55) % 10 == 0, rec.calls
    seen = len(rec.calls)
    pool.drain()  # the chunks still running settle now: the closed bar ignores them
    assert len(rec.calls) == seen


def test_tqdm_bar_is_drawn_through_tqdm_auto(
    pool: fastpool.Pool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tqdm.auto

    bars: list[Any] = []

    class Recording(tqdm.auto.tqdm):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    assert len(list(pool.map(_tasks.double, range(N), chunksize=7, progress=True))) == N
    assert len(bars) == 1
    assert bars[0].n == N and bars[0].total == N
    assert bars[0].disable  # closed: tqdm's close() disables the bar
    assert f"{N}/{N}" in capsys.readouterr().err


def test_progress_tqdm_writes_a_bar_to_stderr(
    pool: fastpool.Pool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(list(pool.imap_unordered(_tasks.double, range(N), progress="tqdm"))) == N
    err = capsys.readouterr().err
    assert f"{N}/{N}" in err and "double" in err  # the function's name labels the bar


def test_without_tqdm_progress_names_the_extra_and_submits_nothing(
    pool: fastpool.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"pip install 'fastpool\[progress\]'"):
        pool.map(_tasks.double, range(N), progress=True)
    with pytest.raises(ImportError, match=r"fastpool\[progress\]"):
        fastpool.progress([])
    assert pool.stats()["chunks_submitted"] == 0


def test_rich_is_opt_in(pool: fastpool.Pool, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich")
    assert len(list(pool.map(_tasks.double, range(N), progress="rich"))) == N
    assert "100%" in capsys.readouterr().out  # rich's final frame on a non-terminal


def test_a_bad_progress_value_is_a_type_error_before_anything_runs(pool: fastpool.Pool) -> None:
    with pytest.raises(TypeError, match="progress must be"):
        pool.map(_tasks.double, range(N), progress="bar")
    assert pool.stats()["chunks_submitted"] == 0


def test_progress_over_futures_counts_them_as_they_finish(
    pool: fastpool.Pool, tmp_path: Any
) -> None:
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    futures = [pool.submit(_tasks.gated, "slow", started, gate)]
    futures += [pool.submit(_tasks.double, i) for i in range(5)]
    rec = Recorder()
    wrapped = fastpool.progress(futures, kind=rec)
    assert list(wrapped) == futures  # the same futures, the same order
    # all but the gated one finish (and those prefetched behind it on its worker)
    wait_for(
        lambda: rec.done >= 3 and rec.done == pool.stats()["calls_completed"],
        what=lambda: f"finished futures counted: {rec.calls}, stats {pool.stats()}",
    )
    assert rec.calls[-1][1] == 6 and not futures[0].done()
    open(gate, "w").close()
    assert futures[0].result(timeout=30) == "slow"
    wait_for(lambda: rec.done == 6, what="the last future counted")


def test_progress_over_a_generator_of_futures_closes_when_all_finished(tmp_path: Any) -> None:
    # any concurrent.futures.Future: here a thread pool's
    with ThreadPoolExecutor(2) as ex:
        rec = Recorder()
        got = [
            f.result() for f in fastpool.progress((ex.submit(abs, -i) for i in range(20)), kind=rec)
        ]
    assert got == list(range(20))
    assert rec.calls[-1] == (20, None)  # a generator: no total


def test_progress_bar_closes_after_the_last_future(
    pool: fastpool.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tqdm.auto

    bars: list[Any] = []

    class Recording(tqdm.auto.tqdm):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, file=open(os.devnull, "w"), **kwargs)  # noqa: SIM115
            bars.append(self)

        def close(self) -> None:
            super().close()
            self.fp.close()

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    futures = list(
        fastpool.progress(pool.submit(_tasks.double, i) for i in range(10))
    )  # exhausted at once
    assert [f.result(timeout=30) for f in futures] == [2 * i for i in range(10)]
    wait_for(lambda: bars[0].disable, what="the bar closed after the last future")
    assert bars[0].n == 10
