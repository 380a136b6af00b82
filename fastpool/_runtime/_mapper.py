"""How a map runs: the one engine behind every map fastpool offers.

    Pool.map / imap_unordered ---+
    Pool.amap (asyncio driver) --+--> MapRun: the input cut into chunks (Chunks),
    dask.Executor.map -----------+    a window of chunks in flight, the chunk size
    joblib backend (run_map) ----+    adapted to measured run time, the deadline
                                       |  target._submit_chunk(fn, chunk, star)
                                       v
                                  a Future per chunk; its value is the chunk's
                                  result list, or a ChunkFailure (the results
                                  before the failing item, then the error)
    _stream (head / first done) <---- settled chunks, yielded as lists;
    MapIterator                       hand_out() gives each item and forgets it

What runs a chunk is the *target*: a ``Pool`` or the Dask executor, through the
few methods of ``MapTarget``.  The engine never waits on anything but the
futures it was given and the target's ``_wait_any``; the asyncio driver
(``_integrations._aio``) shares ``MapRun`` and replaces only the waiting.

Thread safety: a MapRun, and the iterator over it, belong to one consuming
thread (or one task on one loop); the targets it calls are thread-safe.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol, Sequence, cast

from fastpool._runtime import _arrays, _numbers
from fastpool._runtime._call import ChunkFailure, TaskFunction

MAX_CHUNKSIZE = 8192
CHUNKS_PER_WORKER = 8  # a sized input: each worker gets about this many chunks
PROGRESS_CHUNKS_PER_WORKER = 100  # with a progress bar: it moves in steps of <= 1%
WINDOW_ITEMS = 32768  # a map keeps about this many small items in flight...
# ...or this many when they travel compact (packed numbers, slices of a 1-D ndarray: a
# few bytes each, 1 MiB of int64): enough that a worker never waits for the consumer to take the
# head chunk while the other worker (or the parent, with as many cores as workers)
# holds the CPU.  Measured on 2 workers and 2 cores, a map of 200,000 ints ran 10-15%
# faster than with WINDOW_ITEMS in flight.
COMPACT_WINDOW_ITEMS = 131072
MAX_WINDOW_PER_WORKER = 64  # ...in at most this many chunks per worker
# A map of large arrays keeps at most about this many bytes of them in flight (and at
# least one chunk per worker and one spare): each one sent by value is copied into the
# arena, so 128 chunks of 64 MiB slices would all be copied at once (issue 24: the
# batch of 32 slices of a 2 GiB array added 2.6 GiB at its peak); a few slices at a
# time keep both workers busy as well.  Measured on that batch (2 workers, 8 runs each): at
# 128 MiB (three 64 MiB slices in flight: the one-per-worker-plus-a-spare floor) its peak
# read 960-1,218 MiB (median 1,088) against 1,033-1,280 (median 1,158) at 256 MiB, in
# the same 4.2-5.9 s; the peak's rest is the tasks' own float64 temporaries.
WINDOW_BYTES = 128 << 20


class Sizing(NamedTuple):
    """How a target wants a map's chunks sized.

    ``workers``: how many chunks it runs at once.  ``first_chunksize``: the chunk
    size for an input without a length, before any chunk was timed.
    ``target_chunk_s``: the run time per chunk an adaptive size aims at (what one
    chunk's round trip costs decides it: microseconds in a Pool, milliseconds
    for a Dask task)."""

    workers: int
    first_chunksize: int = 4
    target_chunk_s: float = 0.002


class MapTarget(Protocol):
    """What runs a map's chunks.  Every method is thread-safe."""

    def _map_sizing(self) -> Sizing:
        """Raises PoolClosed (or the target's own closed error) when closed."""

    def _submit_chunk(self, fn: Callable[..., Any], chunk: Sequence[Any], star: bool) -> Future:
        """A future of ``run_chunk(fn, chunk, star)``: a list, or a ChunkFailure.
        Raises what ``submit`` raises (nothing is submitted then)."""

    def _chunk_seconds(self, fut: Future) -> float | None:
        """The measured run time of a settled chunk (None: not known)."""

    def _wait_any(self, pending: Sequence[Future], done: deque, timeout: float | None) -> None:
        """Returns once ``done`` (filled by done-callbacks) is not empty, or after
        ``timeout``; a consumer thread may drive the target meanwhile."""

    def _cancel_chunk(self, fut: Future) -> None:
        """Cancels a chunk nobody will read: one not started never runs."""


def check_options(chunksize: Any, buffersize: Any) -> None:
    """Raises ValueError for a chunksize that is not a positive int, TypeError for
    a buffersize that is not an int, ValueError for one below 1 (as
    ``Executor.map`` of Python 3.14)."""
    if chunksize is not None and (
        not isinstance(chunksize, int) or isinstance(chunksize, bool) or chunksize < 1
    ):
        raise ValueError(f"chunksize must be a positive int, not {chunksize!r}")
    if buffersize is not None and not isinstance(buffersize, int):
        raise TypeError(f"buffersize must be an integer or None, not {buffersize!r}")
    if buffersize is not None and buffersize < 1:
        raise ValueError(f"buffersize must be None or > 0, not {buffersize!r}")


def window(workers: int, chunksize: int, compact: bool = False) -> int:
    """Chunks in flight: two per worker and two spare, and for small chunks enough
    to keep WINDOW_ITEMS items (COMPACT_WINDOW_ITEMS for ``compact`` ones) under way,
    capped: with fewer, each chunk costs a round trip, and a worker whose queue ran
    dry waits on the consumer."""
    items = COMPACT_WINDOW_ITEMS if compact else WINDOW_ITEMS
    return max(2 * workers + 2, min(MAX_WINDOW_PER_WORKER * workers, items // chunksize))


class Chunks:
    """The input of a map, cut into chunks.  A list of numbers (ints, floats,
    bools, NumPy scalars) is packed into one buffer per chunk (``_numbers``)
    without slicing it; a list, tuple, range or ndarray is sliced (an ndarray
    chunk travels as one array, not a list of scalars); anything else is read
    with islice.  ``size`` adapts to measured run time when the input has no
    length and no chunksize was given."""

    def __init__(
        self, iterables: tuple, chunksize: int | None, sizing: Sizing, bar: bool = False
    ) -> None:
        self.adaptive = False
        self.target_s = sizing.target_chunk_s
        if chunksize is None:
            try:
                n = min(len(x) for x in iterables)
                # with a progress bar, chunks small enough that it counts items as they finish
                per_worker = PROGRESS_CHUNKS_PER_WORKER if bar else CHUNKS_PER_WORKER
                chunksize = max(1, min(MAX_CHUNKSIZE, math.ceil(n / (sizing.workers * per_worker))))
            except TypeError:
                chunksize, self.adaptive = sizing.first_chunksize, True
        self.size: int = chunksize
        self.pos = 0
        seq = iterables[0] if len(iterables) == 1 else None
        self.seq = seq if type(seq) in (list, tuple, range) or _arrays.is_ndarray(seq) else None
        self.numbers = type(seq) is list  # until a chunk of it does not pack
        self.first = _numbers.pack(seq, 0, chunksize) if self.numbers else None
        # what travels is a few bytes per item: packed numbers, or slices of a 1-D ndarray
        # (a row of a 2-D one may weigh anything)
        self.compact = self.first is not None or (_arrays.is_ndarray(seq) and seq.ndim == 1)
        self.it = (
            None
            if self.seq is not None
            else (zip(*iterables) if len(iterables) > 1 else iter(iterables[0]))
        )

    def next(self) -> Any:
        """The next chunk, or None once the input is exhausted."""
        if self.seq is not None:
            start = self.pos
            self.pos += self.size
            if self.numbers:
                packed, self.first = self.first, None  # the first chunk was packed already
                if packed is None:
                    packed = _numbers.pack(self.seq, start, self.pos)
                if packed is not None:
                    return packed
                # a chunk of MIN_ITEMS or more that did not pack: stop trying
                self.numbers = len(self.seq) - start < _numbers.MIN_ITEMS
            chunk = self.seq[start : self.pos]
            return chunk if len(chunk) else None
        chunk = list(islice(self.it, self.size))  # type: ignore[arg-type]
        return chunk or None

    def measured(self, items: int, run_s: float | None) -> None:
        """A chunk of ``items`` items ran ``run_s`` seconds: aim the next at target_s."""
        if self.adaptive and items and run_s is not None:
            self.size = aimed_size(items, run_s, self.target_s)


def aimed_size(items: int, run_s: float, target_s: float) -> int:
    """The chunk size that runs about ``target_s`` seconds, from a chunk of ``items``
    items that ran ``run_s`` seconds: the one rule for adaptive chunk sizes (a map's
    chunks here, the joblib backend's batches), between 1 and MAX_CHUNKSIZE."""
    per_item = max(run_s / max(items, 1), 1e-9)
    return int(min(MAX_CHUNKSIZE, max(1, target_s / per_item)))


def outcome(value: Any) -> tuple[list, BaseException | None]:
    """A settled chunk's value as (results, the error after them, or None)."""
    if type(value) is ChunkFailure:
        return value.unpack()
    return value, None


class MapRun:
    """One map: its chunks, the window in flight, the deadline, partial failure.

    Constructing it checks the arguments and submits nothing.  ``start`` fills
    the window and returns the chunk stream a sync consumer reads; the asyncio
    driver uses ``next_chunk``/``sent``/``take``/``cancel_pending`` instead.
    Raises PoolClosed (the target is closed), TypeError (no iterable; a bad
    buffersize), ValueError (a bad chunksize or buffersize).  One consumer."""

    def __init__(
        self,
        target: MapTarget,
        fn: Callable[..., Any],
        iterables: tuple,
        *,
        chunksize: int | None = None,
        timeout: float | None = None,
        buffersize: int | None = None,
        bar: bool = False,
    ) -> None:
        sizing = target._map_sizing()
        if not iterables:
            raise TypeError("map() needs at least one iterable")
        check_options(chunksize, buffersize)
        self.target = target
        self.fn = fn.fn if type(fn) is TaskFunction else fn
        self.star = len(iterables) > 1
        self.chunks = Chunks(iterables, chunksize, sizing, bar)
        self.window = buffersize or window(sizing.workers, self.chunks.size, self.chunks.compact)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.pending: deque[Future] = deque()  # submitted, not taken (submission order)
        self.exhausted = False
        self.min_window = min(self.window, sizing.workers + 1)  # what WINDOW_BYTES leaves
        self.nbytes: dict[Future, int] = {}  # the array bytes of each pending chunk that has any
        self.pending_bytes = 0
        self._chunk_bytes = 0  # of the chunk next_chunk returned, until sent() names its future
        self.on_submit: Callable[[Future], None] | None = None
        # told how many items went out once the stream ends, however (a bar's close)
        self.on_end: Callable[[int], None] | None = None
        self.input_error: Exception | None = None  # what reading the input raised

    def next_chunk(self) -> Any:
        """The next chunk to submit, or None: the window is full or the input ran out."""
        if self.exhausted or len(self.pending) >= self.window:
            return None
        if self.pending_bytes >= WINDOW_BYTES and len(self.pending) >= self.min_window:
            return None
        try:
            chunk = self.chunks.next()
        except Exception as exc:  # noqa: BLE001 - the input's own error: raised at its position
            # The chunks read before it still run and come back first (multiprocessing's
            # imap does the same); the items of the chunk it broke are not run.
            self.input_error, chunk = exc, None
        if chunk is None:
            self.exhausted = True
        else:
            self._chunk_bytes = _arrays.array_bytes(chunk)
        return chunk

    def sent(self, fut: Future) -> None:
        self.pending.append(fut)
        if self._chunk_bytes:
            self.nbytes[fut] = self._chunk_bytes
            self.pending_bytes += self._chunk_bytes
            self._chunk_bytes = 0
        if self.on_submit is not None:
            self.on_submit(fut)

    def feed(self) -> None:
        """Submits chunks until the window is full or the input is exhausted."""
        while (chunk := self.next_chunk()) is not None:
            self.sent(self.target._submit_chunk(self.fn, chunk, self.star))

    def raise_input_error(self) -> None:
        """Raises, once, what reading the input raised: when every chunk read before it
        has been taken."""
        exc, self.input_error = self.input_error, None
        if exc is not None:
            raise exc

    def left(self) -> float | None:
        """Seconds to the deadline; raises TimeoutError once it has passed."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise FuturesTimeout()
        return left

    def take(self, fut: Future) -> tuple[list, BaseException | None]:
        """A settled chunk leaves the window: (its results, the error after them)."""
        if self.pending[0] is fut:
            self.pending.popleft()
        else:
            self.pending.remove(fut)
        self.pending_bytes -= self.nbytes.pop(fut, 0)
        value = fut.result(0)  # raises the chunk's own failure (a crash, a timeout...)
        results, error = outcome(value)
        if self.chunks.adaptive:
            self.chunks.measured(len(results), self.target._chunk_seconds(fut))
        return results, error

    def cancel_pending(self, cancel: Callable[[Future], Any] | None = None) -> None:
        """Cancels every chunk not taken (those not started never run), with
        ``cancel`` if given (amap's ``force_cancel``), else the target's rules."""
        pending, self.pending = self.pending, deque()
        self.exhausted = True
        self.nbytes.clear()
        self.pending_bytes = 0
        for fut in pending:
            if not fut.done():
                (cancel or self.target._cancel_chunk)(fut)

    def start(self, ordered: bool) -> Iterator[list]:
        """Fills the window now (a map submits at call time), then returns the
        stream of settled chunks' result lists, in input order or as they settle."""
        if ordered:
            self.feed()
            if not self.pending:  # the input broke before its first chunk: raise at the call
                self.raise_input_error()
            return _stream(self, functools.partial(_head, self))
        done: deque[Future] = deque()
        user_hook = self.on_submit

        def track(fut: Future) -> None:
            fut.add_done_callback(done.append)
            if user_hook is not None:
                user_hook(fut)

        self.on_submit = track
        self.feed()
        if not self.pending:
            self.raise_input_error()
        return _stream(self, functools.partial(_first_done, self, done))


def _stream(run: MapRun, next_settled: Callable[[], Future]) -> Iterator[list]:
    """Settled chunks' results, refilling the window after each; a failed chunk's
    results, then its error.  However it ends, the chunks not taken are cancelled, then
    ``run.on_end`` hears how many items went out.  Ctrl-C in the wait comes out without
    the dispatcher's frames under it: the caller's line says where the map stopped."""
    handed = 0
    try:
        while run.pending:
            try:
                settled = next_settled()
            except KeyboardInterrupt as stop:
                raise stop.with_traceback(None)  # Ctrl-C while the map waited for a chunk
            results, error = run.take(settled)
            del settled  # no frame keeps the future
            run.feed()
            handed += len(results)
            yield results
            if error is not None:
                raise error
        run.raise_input_error()
    finally:
        run.cancel_pending()
        if run.on_end is not None:
            run.on_end(handed)


def _head(run: MapRun) -> Future:
    head = run.pending[0]
    head.result(run.left())  # waits; the head stays pending, so a timeout cancels it
    return head


def _first_done(run: MapRun, done: deque) -> Future:
    while not done:
        run.target._wait_any(run.pending, done, run.left())
    return done.popleft()


def hand_out(results: list) -> Iterator[Any]:
    """The items of a chunk's result list, each removed from the list as it is
    handed out; a tuple (numbers from ``_numbers``, whose lifetime nobody can
    observe: none of them can be weakly referenced) is iterated as it is."""
    # Each item leaves the list as it is handed out, so a result lives only as
    # long as the consumer keeps it (CPython's test_free_reference); popping from
    # the end of the reversed list keeps the iteration in C.
    if type(results) is not list:
        return iter(results)
    results.reverse()
    return map(list.pop, itertools.repeat(results, len(results)))  # faster than starmap


class MapIterator(itertools.chain):
    """The iterator a map returns: the items of each settled chunk, iterated in C,
    plus ``close()`` as a generator has it, which cancels the chunks not taken."""

    _chunks: Iterator[list]

    @classmethod
    def over(cls, chunks: Iterator[list]) -> "MapIterator":
        it = cast("MapIterator", cls.from_iterable(map(hand_out, chunks)))
        it._chunks = chunks
        return it

    def close(self) -> None:
        """Stops the map: the chunks not taken are cancelled (those not started never
        run).  From the consuming thread (a generator's rule)."""
        self._chunks.close()  # type: ignore[attr-defined]


def run_map(
    target: MapTarget,
    fn: Callable[..., Any],
    iterables: Iterable[Iterable[Any]],
    *,
    ordered: bool = True,
    chunksize: int | None = None,
    timeout: float | None = None,
    buffersize: int | None = None,
) -> MapIterator:
    """The engine's entry point: ``fn`` over the zipped ``iterables`` on ``target``.

    Returns an iterator of results, in input order (``ordered=True``) or as
    chunks settle; it holds the target, so a map keeps its pool alive.  A
    failing item's exception is raised at its position, after the results
    before it; an exception raised by the input itself is raised after the results
    of the chunks read before it (the items of the chunk it broke do not run);
    a chunk's own failure (crash, task timeout) is raised when its
    turn comes; ``timeout`` (seconds from this call) raises TimeoutError.
    Whenever the iterator stops early (an error, a timeout, ``close()``, being
    dropped), the chunks not taken are cancelled: those not started never run.
    At most ``buffersize`` chunks (default: ``window``) are submitted ahead of
    the consumer.  Raises at once what MapRun raises.  One consuming thread."""
    run = MapRun(
        target,
        fn,
        tuple(iterables),
        chunksize=chunksize,
        timeout=timeout,
        buffersize=buffersize,
    )
    return MapIterator.over(run.start(ordered))
