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
# How a map without a chunksize sizes its chunks (``next_size``; docs/tuning.md, "How a map
# cuts its input").  Nothing is known of an item's cost until a chunk comes back, and a
# chunk of long items put on one worker while another waits is time lost for good (issue
# 31: 20 items of 0.2 s cut into chunks of 4 ran 12 on one worker and 8 on the other,
# 2.6 s for 2.0 s of compute).  So a map first sends one chunk of ``first_chunksize``
# items (1 in a Pool) per worker, and nothing more until one of them settles: joblib's
# auto-batching starts at one item too.  Then each chunk is aimed at ``target_chunk_s`` of
# work by the latest measured time per item, growing at most GROWTH times the largest
# chunk measured so far (a few cheap first items do not make the next chunk huge: a chunk
# of 1 item measures mostly the per-chunk cost, which keeps the aim low while it grows),
# and shrinking as soon as two of the latest RECENT measures agree (the lower median: a
# worker preempted for a few milliseconds under load makes one chunk look slow, and each
# smaller chunk costs a round trip).
GROWTH = 8
RECENT = 3
# With a length, a chunk also holds at most remaining / (GUIDED_PER_WORKER * workers) items
# (OpenMP's guided schedule: chunks shrink as the work runs out, so the last ones cannot
# leave a worker waiting long), but it never shrinks below the size aimed at
# target_chunk_s / TAIL_FRACTION: a chunk that short cannot unbalance the end, and a
# thousand-item tail of one-item chunks would cost a round trip each.
GUIDED_PER_WORKER = 2
TAIL_FRACTION = 4
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

    ``workers``: how many chunks it runs at once.  ``first_chunksize``: the size of
    the first chunks, one per worker, sent before any chunk was timed.
    ``target_chunk_s``: the run time per chunk an adaptive size aims at (what one
    chunk's round trip costs decides it: microseconds in a Pool, milliseconds
    for a Dask task)."""

    workers: int
    first_chunksize: int = 1
    target_chunk_s: float = 0.002


class MapTarget(Protocol):
    """What runs a map's chunks.  Every method is thread-safe."""

    def _map_sizing(self) -> Sizing:
        """Raises PoolClosed (or the target's own closed error) when closed."""

    def _submit_chunk(
        self, fn: Callable[..., Any], chunk: Sequence[Any], star: bool, *, memo: Any = None
    ) -> Future:
        """A future of ``run_chunk(fn, chunk, star)``: a list, or a ChunkFailure.
        ``memo``: the map's ``_arrays.CopyMemo`` (a target that copies arrays into
        shared memory copies each one once for all the chunks that pass it).
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
    with islice.  Without a chunksize, ``next_size`` sizes each chunk from what
    ``observed`` was told (``adaptive``)."""

    def __init__(
        self, iterables: tuple, chunksize: int | None, sizing: Sizing, bar: bool = False
    ) -> None:
        self.adaptive = chunksize is None
        self.workers = sizing.workers
        self.target_s = sizing.target_chunk_s
        self.cap = MAX_CHUNKSIZE
        self.left: int | None = None  # items not cut yet, when the input has a length
        self.per_item: float | None = None  # seconds: the lower median of ``recent``
        self.recent: deque[float] = deque(maxlen=RECENT)  # per item, the latest measures
        self.grown = 0  # the most items a measured chunk held
        self.settled = False  # a chunk has settled: the first ones are no longer all there is
        if chunksize is None:
            chunksize = sizing.first_chunksize
            try:
                self.left = min(len(x) for x in iterables)
            except TypeError:
                pass
            else:
                if bar:  # chunks small enough that the bar counts items as they finish
                    per_bar = math.ceil(self.left / (sizing.workers * PROGRESS_CHUNKS_PER_WORKER))
                    self.cap = max(1, min(MAX_CHUNKSIZE, per_bar))
        self.size: int = min(chunksize, self.cap) if self.adaptive else chunksize
        self.pos = 0
        seq = iterables[0] if len(iterables) == 1 else None
        self.seq = seq if type(seq) in (list, tuple, range) or _arrays.is_ndarray(seq) else None
        self.numbers = type(seq) is list  # until a chunk of it does not pack
        # what travels is a few bytes per item: packed numbers, or slices of a 1-D ndarray
        # (a row of a 2-D one may weigh anything)
        self.compact = (self.numbers and _numbers.pack(seq, 0, _numbers.MIN_ITEMS) is not None) or (
            _arrays.is_ndarray(seq) and seq.ndim == 1
        )
        self.it = (
            None
            if self.seq is not None
            else (zip(*iterables) if len(iterables) > 1 else iter(iterables[0]))
        )

    def next(self) -> Any:
        """The next chunk, or None once the input is exhausted."""
        if self.adaptive and self.settled:
            self.size = next_size(
                self.per_item, self.grown, self.target_s, self.left, self.workers, self.cap
            )
        if self.seq is not None:
            start = self.pos
            self.pos += self.size
            if self.left is not None:
                self.left = max(0, len(self.seq) - self.pos)
            if self.numbers:
                packed = _numbers.pack(self.seq, start, self.pos)
                if packed is not None:
                    return packed
                # a chunk of MIN_ITEMS or more that did not pack: stop trying
                self.numbers = min(self.pos, len(self.seq)) - start < _numbers.MIN_ITEMS
            chunk = self.seq[start : self.pos]
            return chunk if len(chunk) else None
        chunk = list(islice(self.it, self.size))  # type: ignore[arg-type]
        if self.left is not None:
            self.left = max(0, self.left - len(chunk))
        return chunk or None

    def observed(self, items: int, run_s: float | None) -> None:
        """A chunk of ``items`` items settled, having run ``run_s`` seconds (None: not
        known, or it failed: it ends the first round without a measure)."""
        self.settled = True
        if items and run_s is not None:
            self.recent.append(max(run_s / items, 1e-9))
            self.per_item = sorted(self.recent)[(len(self.recent) - 1) // 2]
            self.grown = max(self.grown, items)


def aimed_size(items: int, run_s: float, target_s: float) -> int:
    """The chunk size that runs about ``target_s`` seconds, from a chunk of ``items``
    items that ran ``run_s`` seconds: the one rule for adaptive chunk sizes (a map's
    chunks through ``next_size``, the joblib backend's batches), between 1 and
    MAX_CHUNKSIZE."""
    per_item = max(run_s / max(items, 1), 1e-9)
    return int(min(MAX_CHUNKSIZE, max(1, target_s / per_item)))


def next_size(
    per_item: float | None,
    grown: int,
    target_s: float,
    left: int | None,
    workers: int,
    cap: int = MAX_CHUNKSIZE,
) -> int:
    """The size of a map's next chunk (no chunksize given), once a chunk has settled.

    ``per_item``: seconds an item runs, as measured (Chunks passes the lower median of
    the latest RECENT chunks; None: none was measured: the size stays 1); ``grown``:
    the most items a measured chunk held; ``left``: the items not cut yet (None: no
    length).  Aims at ``target_s`` of work, grows at most GROWTH times ``grown``, holds
    at most ``left / (GUIDED_PER_WORKER * workers)`` items unless that runs under
    ``target_s / TAIL_FRACTION``, at most ``cap``, at least 1.  A pure function: the
    whole policy, for tests and docs."""
    if per_item is None:
        return 1
    aimed = aimed_size(1, per_item, target_s)
    size = min(aimed, GROWTH * max(grown, 1), cap)
    if left is not None:
        guided = math.ceil(left / (GUIDED_PER_WORKER * max(workers, 1)))
        tail = target_s / TAIL_FRACTION / max(per_item, 1e-9)  # not capped at MAX_CHUNKSIZE
        size = min(size, max(guided, tail))
    return max(1, int(size))


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
        self.workers = sizing.workers
        self.buffersize = buffersize
        self.window = buffersize or window(sizing.workers, self.chunks.size, self.chunks.compact)
        if self.chunks.adaptive and buffersize is None:
            self.window = sizing.workers  # the first round: one chunk per worker
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.pending: deque[Future] = deque()  # submitted, not taken (submission order)
        self.exhausted = False
        self.min_window = min(self.window, sizing.workers + 1)  # what WINDOW_BYTES leaves
        # adaptive sizes: each chunk's item count until it settles; the settled, not yet
        # observed (a done-callback appends, on whichever thread settles the chunk)
        self.items: dict[Future, int] = {}
        self.settled: deque[Future] = deque()
        self.nbytes: dict[Future, int] = {}  # the array bytes of each pending chunk that has any
        self.pending_bytes = 0
        self._chunk_bytes = 0  # of the chunk next_chunk returned, until sent() names its future
        self._chunk_items = 0  # the same chunk's length
        self.on_submit: Callable[[Future], None] | None = None
        # told how many items went out once the stream ends, however (a bar's close)
        self.on_end: Callable[[int], None] | None = None
        self.input_error: Exception | None = None  # what reading the input raised
        # This map's copies of arrays into shared memory, one per array for all its chunks.
        # Held only while it still submits (the chunks hold it until they settle), and never
        # shared with another map: an array changed between two maps is copied again.
        self.memo: _arrays.CopyMemo | None = _arrays.CopyMemo()

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
            self.exhausted, self.memo = True, None
        else:
            self._chunk_bytes = _arrays.array_bytes(chunk)
            self._chunk_items = len(chunk)
        return chunk

    def sent(self, fut: Future) -> None:
        self.pending.append(fut)
        if self.chunks.adaptive:
            self.items[fut] = self._chunk_items
            fut.add_done_callback(self.settled.append)
        if self._chunk_bytes:
            self.nbytes[fut] = self._chunk_bytes
            self.pending_bytes += self._chunk_bytes
            self._chunk_bytes = 0
        if self.on_submit is not None:
            self.on_submit(fut)

    def feed(self) -> None:
        """Submits chunks until the window is full or the input is exhausted."""
        while (chunk := self.next_chunk()) is not None:
            self.sent(self.target._submit_chunk(self.fn, chunk, self.star, memo=self.memo))

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
        if self.chunks.adaptive:
            self.observe()
        value = fut.result(0)  # raises the chunk's own failure (a crash, a timeout...)
        return outcome(value)

    @property
    def first_round(self) -> bool:
        """Sizing adaptively, and no chunk has settled yet: one chunk per worker is out."""
        return self.chunks.adaptive and not self.chunks.settled

    def observe(self) -> None:
        """Tells the chunk sizes what every chunk settled since the last call ran, and
        sizes the window: one chunk per worker until the first settles, then
        ``window`` for the chunk size now (unless ``buffersize`` fixed it)."""
        chunks = self.chunks
        while self.settled:
            fut = self.settled.popleft()
            items = self.items.pop(fut, 0)
            # a cancelled chunk, or one whose run time is not known, measures nothing
            run_s = None if fut.cancelled() else self.target._chunk_seconds(fut)
            chunks.observed(items, run_s or None)
        if chunks.settled and self.buffersize is None:
            size, aimed = (
                next_size(
                    chunks.per_item, g, chunks.target_s, chunks.left, self.workers, chunks.cap
                )
                for g in (chunks.grown, MAX_CHUNKSIZE)
            )
            # While the size still grows, a few chunks in flight: a full window of small
            # ones would all be cut at a size the next measure has outgrown.
            # Counted for the largest size measured: a size that shrank for a while keeps
            # the window it had, not one of many more small chunks.
            growing = size < aimed
            self.window = (
                2 * self.workers + 2
                if growing
                else window(self.workers, max(size, chunks.grown), chunks.compact)
            )

    def cancel_pending(self, cancel: Callable[[Future], Any] | None = None) -> None:
        """Cancels every chunk not taken (those not started never run), with
        ``cancel`` if given (amap's ``force_cancel``), else the target's rules."""
        pending, self.pending = self.pending, deque()
        self.exhausted, self.memo = True, None
        self.nbytes.clear()
        self.items.clear()
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
    # Until a first chunk settles, a window of one chunk per worker is all there is: a
    # worker done with its chunk must not wait for the head's to get more, so any chunk
    # that settles sizes the next ones and refills the window.
    while run.first_round and not head.done():
        run.target._wait_any(run.pending, run.settled, run.left())
        run.observe()
        run.feed()
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
