"""How a map without a chunksize cuts its input (issue 31, item 2), on a fake target
whose chunks settle when the test says, with the run time the test says: the policy
without a process or a clock (``_mapper.next_size`` and the window MapRun keeps)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Sequence

import pytest

from fastpool._runtime import _arrays, _mapper


def test_nothing_measured_is_one_item() -> None:
    assert _mapper.next_size(None, 0, 0.002, None, 2) == 1
    assert _mapper.next_size(None, 0, 0.002, 10_000, 2) == 1


@pytest.mark.parametrize("left", [None, 20, 10_000])
def test_a_long_item_is_a_chunk_of_its_own(left: int | None) -> None:
    assert _mapper.next_size(0.2, 1, 0.002, left, 2) == 1
    assert _mapper.next_size(0.003, 64, 0.002, left, 2) == 1  # over the target: 1, not 0


def test_tiny_items_grow_geometrically_from_what_was_measured() -> None:
    sizes, grown = [], 1
    while grown < _mapper.MAX_CHUNKSIZE:
        grown = _mapper.next_size(1e-8, grown, 0.002, None, 2)
        sizes.append(grown)
    g = _mapper.GROWTH
    assert sizes == [g, g**2, g**3, g**4, _mapper.MAX_CHUNKSIZE]


def test_a_chunk_aims_at_the_target_time() -> None:
    assert _mapper.next_size(1e-4, 1000, 0.002, None, 2) == 20  # 20 x 100 us = 2 ms


def test_with_a_length_chunks_shrink_as_the_work_runs_out() -> None:
    # OpenMP's guided schedule: remaining / (2 * workers) items ...
    assert _mapper.next_size(1e-5, 1000, 0.002, 400, 2) == 100
    assert _mapper.next_size(1e-5, 1000, 0.002, 40, 2) == 50  # ... not below target / 4
    assert _mapper.next_size(1e-3, 1000, 0.002, 40, 2) == 2
    assert _mapper.next_size(0.2, 1000, 0.002, 3, 2) == 1


def test_tiny_items_keep_full_chunks_to_the_end() -> None:
    # 8192 items of 45 ns run 0.37 ms: a quarter of the 2 ms target holds 11,111 of
    # them, more than the largest chunk, so the guided tail never cuts them smaller
    assert _mapper.next_size(45e-9, 8192, 0.002, 20_000, 2) == _mapper.MAX_CHUNKSIZE


def test_a_progress_bar_caps_the_chunk() -> None:
    assert _mapper.next_size(1e-8, 8192, 0.002, None, 2, cap=50) == 50


# ---- the engine on a fake target -----------------------------------------------------


class Chunk(Future):
    """A chunk's future: waiting for it settles it (and the chunks sent before it)."""

    target: FakeTarget

    def result(self, timeout: float | None = None) -> Any:
        while not self.done():
            self.target.settle()
        return super().result(timeout)


class FakeTarget:
    """Chunks are futures that settle when ``settle`` is called, each reporting
    ``run_s(chunk)`` seconds; ``_wait_any`` and waiting for a chunk settle the oldest."""

    def __init__(self, workers: int = 2, run_s: Callable[[Sequence[Any]], float] = len) -> None:
        self.workers = workers
        self.run_s = run_s
        self.chunks: list[list] = []  # every chunk submitted, in order
        self.open: deque[tuple[Future, list]] = deque()
        self.seconds: dict[Future, float] = {}

    def _map_sizing(self) -> _mapper.Sizing:
        return _mapper.Sizing(self.workers)

    def _submit_chunk(
        self, fn: Callable[..., Any], chunk: Sequence[Any], star: bool, *, memo: Any = None
    ) -> Future:
        fut = Chunk()
        fut.target = self
        items = list(chunk)
        self.chunks.append(items)
        self.open.append((fut, items))
        return fut

    def _chunk_seconds(self, fut: Future) -> float | None:
        return self.seconds.get(fut)

    def _wait_any(self, pending: Sequence[Future], done: deque, timeout: float | None) -> None:
        self.settle()

    def _cancel_chunk(self, fut: Future) -> None:
        fut.cancel()

    def settle(self, index: int = 0) -> None:
        fut, items = self.open[index]
        del self.open[index]
        self.seconds[fut] = self.run_s(items)
        fut.set_result(items)


def _run(target: FakeTarget, items: Iterable[Any]) -> _mapper.MapRun:
    run = _mapper.MapRun(target, abs, (items,))
    run.feed()
    return run


def _sizes(target: FakeTarget) -> list[int]:
    return [len(c) for c in target.chunks]


@pytest.mark.parametrize("sized", [True, False], ids=["with-length", "generator"])
def test_the_first_round_is_one_item_per_worker(sized: bool) -> None:
    target = FakeTarget(workers=2)
    _run(target, list(range(100)) if sized else iter(range(100)))
    assert _sizes(target) == [1, 1]


@pytest.mark.parametrize("sized", [True, False], ids=["with-length", "generator"])
def test_long_items_stay_one_per_chunk(sized: bool) -> None:
    # 20 items of 0.2 s (issue 31's twenty filters): every chunk one item, so a worker
    # done with its item takes the next one and no item waits behind another
    target = FakeTarget(workers=2, run_s=lambda chunk: 0.2 * len(chunk))
    items = list(range(20))
    run = _run(target, items if sized else iter(items))
    got = [x for chunk in _mapper._stream(run, lambda: _mapper._head(run)) for x in chunk]
    assert got == items
    assert _sizes(target) == [1] * 20


def test_tiny_items_grow_to_the_largest_chunk_in_a_few_rounds() -> None:
    target = FakeTarget(workers=2, run_s=lambda chunk: 1e-6 + 1e-8 * len(chunk))
    run = _run(target, iter(range(200_000)))
    got = sum(len(chunk) for chunk in _mapper._stream(run, lambda: _mapper._head(run)))
    assert got == 200_000
    sizes = _sizes(target)
    assert sizes[:2] == [1, 1]
    first_full = sizes.index(_mapper.MAX_CHUNKSIZE)
    assert first_full <= 2 + 4 * (2 * 2 + 2)  # a few chunks per growth step
    assert sorted(sizes[:first_full]) == sizes[:first_full]  # it only grew
    assert len(sizes) <= 2 + first_full + 200_000 // _mapper.MAX_CHUNKSIZE


def test_a_chunk_that_settles_before_the_head_opens_the_window() -> None:
    # The head (item 0) has not settled; item 1 has: the map sends more at once rather
    # than leave that worker waiting for the consumer to get the head.
    target = FakeTarget(workers=2, run_s=lambda chunk: 0.2)
    run = _run(target, iter(range(20)))
    target.settle(1)
    assert run.first_round and len(run.pending) == 2
    run.observe()
    run.feed()
    assert not run.first_round
    assert _sizes(target) == [1] * 20  # a long item measured: one item per chunk, all sent


def test_a_failed_or_cancelled_chunk_ends_the_first_round_without_a_measure() -> None:
    target = FakeTarget(workers=2)
    run = _run(target, iter(range(20)))
    fut, _items = target.open.popleft()
    fut.set_exception(RuntimeError("the chunk's own failure"))
    run.observe()
    assert not run.first_round and run.chunks.per_item is None
    run.feed()
    assert set(_sizes(target)) == {1}


def test_one_slow_measure_does_not_shrink_the_chunks() -> None:
    chunks = _mapper.Chunks((iter(range(10**6)),), None, _mapper.Sizing(2))
    for _ in range(3):
        chunks.observed(8192, 8192 * 1e-8)
    chunks.observed(8192, 0.05)  # its worker was preempted for 50 ms
    assert chunks.per_item == pytest.approx(1e-8)
    chunks.observed(8192, 0.05)  # twice: the items did get slower
    assert chunks.per_item == pytest.approx(0.05 / 8192)


@pytest.mark.parametrize("chunksize", [2, 4])
def test_the_window_counts_the_bytes_of_a_chunk_of_mixed_items(chunksize: int) -> None:
    # issue 32, defect 3: an item after a tuple holding an array may be anything
    np = pytest.importorskip("numpy")
    arr = np.zeros(1000)
    assert _arrays.array_bytes([(arr,), None, 7, (arr, 1)][:chunksize]) == (
        arr.nbytes * (1 if chunksize == 2 else 2)
    )
    assert _arrays.array_bytes([arr, None, "x"]) == arr.nbytes
