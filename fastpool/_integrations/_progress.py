"""Progress: items counted as they finish, drawn in the parent.

    map / imap_unordered(progress=...)          fastpool.progress(futures)
      each chunk future: a done-callback          each future: a done-callback
      adds len(its result list)                   adds 1
                |                                           |
                v                                           v
      Counter.add(n), on the thread that settled the future (the collector, or a
      thread driving the pool), under the counter's own lock
                |
                v
      a sink: tqdm.auto bar | rich Progress | the caller's callable(done, total)

Counts come from settled futures, never from the consumer: an ordered map
whose first chunk is slow still shows the chunks behind it finish.  Only the
parent draws; workers never import tqdm or rich.  Both are optional and
imported when a bar opens, so ``import fastpool`` never pays for them.
"""

from __future__ import annotations

import operator
import threading
from concurrent.futures import Future
from typing import Any, Callable, Generic, Iterable, Literal, TypeVar, Union

from fastpool._runtime._call import ChunkFailure

F = TypeVar("F", bound=Future)  # type: ignore[type-arg]

PROGRESS_EXTRA = "pip install 'fastpool[progress]'"

#: What ``progress=`` takes: off, tqdm, rich, or ``callable(done, total)``.
ProgressArg = Union[None, bool, Literal["tqdm", "rich"], Callable[[int, Union[int, None]], object]]


class _TqdmSink:
    def __init__(self, total: int | None, desc: str | None) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ImportError(
                f"progress=True draws with tqdm, which is not installed: {PROGRESS_EXTRA}"
            ) from None
        # tqdm.auto: a widget in Jupyter, text on a terminal
        self.bar = tqdm(total=total, desc=desc, unit="item", dynamic_ncols=True)

    def update(self, n: int, done: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class _RichSink:
    def __init__(self, total: int | None, desc: str | None) -> None:
        try:
            from rich.progress import Progress
        except ImportError:
            raise ImportError(
                'progress="rich" draws with rich, which is not installed: pip install rich'
            ) from None
        self.progress = Progress(transient=False)
        self.task = self.progress.add_task(desc or "fastpool", total=total)
        self.progress.start()

    def update(self, n: int, done: int) -> None:
        self.progress.update(self.task, completed=done)

    def close(self) -> None:
        self.progress.refresh()
        self.progress.stop()


class _CallSink:
    def __init__(self, fn: Callable[[int, int | None], object], total: int | None) -> None:
        self.fn, self.total = fn, total

    def update(self, n: int, done: int) -> None:
        self.fn(done, self.total)

    def close(self) -> None:
        pass


class Counter:
    """Finished items, told to one sink.  ``add`` is thread-safe and may be
    re-entered from the sink (a callable that submits or waits); counts reach
    the sink in order.  After ``close`` nothing more is counted."""

    def __init__(self, sink: Any, total: int | None) -> None:
        self.sink, self.total = sink, total
        self.done = 0
        self.closed = False
        self.lock = threading.RLock()

    def add(self, n: int) -> None:
        if n <= 0:
            return
        with self.lock:
            if self.closed:
                return
            self.done += n
            self.sink.update(n, self.done)

    def close(self, at_least: int = 0) -> None:
        """Stops counting.  ``at_least``: items the consumer already holds; a
        done-callback that has not run yet (another thread settled the chunk) is
        still counted, so a finished map never closes short of its total."""
        with self.lock:
            if self.closed:
                return
            if at_least > self.done:
                n, self.done = at_least - self.done, at_least
                self.sink.update(n, self.done)
            self.closed = True
            self.sink.close()

    # ---- done-callbacks ---------------------------------------------------------------

    def chunk_done(self, fut: Future) -> None:  # type: ignore[type-arg]
        """A map chunk settled: its results (a failed chunk's partial ones) count."""
        if fut.cancelled() or fut.exception() is not None:
            return  # a crash or a cancel: nothing of the chunk is known to have finished
        res = fut.result()
        self.add(len(res.results) if isinstance(res, ChunkFailure) else len(res))

    def future_done(self, fut: Future) -> None:  # type: ignore[type-arg]
        self.add(1)


def total_of(iterables: Iterable[Any]) -> int | None:
    """The item count a map will see: the shortest input's ``len()`` or
    ``__length_hint__``; None when any input cannot tell."""
    known = [operator.length_hint(it, -1) for it in iterables]
    return None if not known or min(known) < 0 else min(known)


def open_counter(
    progress: ProgressArg, total: int | None, desc: str | None = None
) -> Counter | None:
    """The counter behind a ``progress=`` argument; None when progress is off.

    Raises ImportError naming the extra when tqdm (or rich) is missing, and
    TypeError for a value that is none of the accepted ones; nothing has been
    submitted when it raises."""
    if progress is None or progress is False:
        return None
    sink: Any
    if progress is True or progress == "tqdm":
        sink = _TqdmSink(total, desc)
    elif progress == "rich":
        sink = _RichSink(total, desc)
    elif callable(progress) and not isinstance(progress, str):
        sink = _CallSink(progress, total)
    else:
        raise TypeError(
            'progress must be None, True, "tqdm", "rich" or a callable(done, total), '
            f"not {progress!r}"
        )
    return Counter(sink, total)


class _Tally:
    """What a ``Progress`` iterator's done-callbacks share: the futures seen and
    finished.  Not the iterator itself, so that dropping the iterator early
    closes the bar while callbacks of the futures it handed out stay harmless."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.seen = self.finished = 0
        self.exhausted = False
        self.lock = threading.Lock()

    def done(self, fut: Future) -> None:  # type: ignore[type-arg]
        self.counter.add(1)
        with self.lock:
            self.finished += 1
            last = self.exhausted and self.finished == self.seen
        if last:
            self.counter.close()

    def end(self) -> None:
        with self.lock:
            self.exhausted = True
            last = self.finished == self.seen
        if last:
            self.counter.close()


class Progress(Generic[F]):
    """The iterator ``fastpool.progress`` returns: the same futures, in the same
    order, while a bar counts the ones that finished (in any order)."""

    def __init__(self, futures: Iterable[F], counter: Counter) -> None:
        self._it = iter(futures)
        self._tally = _Tally(counter)

    def __iter__(self) -> Progress[F]:
        return self

    def __next__(self) -> F:
        tally = self._tally
        try:
            fut = next(self._it)
        except StopIteration:
            tally.end()
            raise
        except BaseException:
            self.close()
            raise
        with tally.lock:
            tally.seen += 1
        fut.add_done_callback(tally.done)
        return fut

    def close(self) -> None:
        """Stops counting now (the bar closes even if futures are still running)."""
        self._tally.counter.close()

    def __del__(self) -> None:
        # dropped before the end (a break): a bar left open would redraw forever
        tally = getattr(self, "_tally", None)
        if tally is not None and not tally.exhausted:
            tally.counter.close()


def progress(
    futures: Iterable[F],
    *,
    total: int | None = None,
    kind: ProgressArg = True,
    desc: str | None = None,
) -> Progress[F]:
    """Wraps an iterable of futures: yields the same futures in the same order,
    while a progress bar counts those that finished, in whatever order they do.

    ``total`` defaults to ``len(futures)`` or its ``__length_hint__`` (None: a
    counter without a bar).  ``kind``: True or "tqdm" (``tqdm.auto``: a widget
    in Jupyter, text on a terminal), "rich", or a ``callable(done, total)``.
    The bar closes when every future seen has finished and the input is
    exhausted, or when the iterator is closed or dropped.  Works with any
    ``concurrent.futures.Future`` (fastpool's, ``ProcessPoolExecutor``'s, ...).

    Raises ImportError naming the extra (``pip install 'fastpool[progress]'``)
    when tqdm is missing.  The bar is updated from the thread that settles each
    future; a callable must be thread-safe.  Each iterator belongs to one thread."""
    counter = open_counter(kind, total if total is not None else total_of([futures]), desc)
    if counter is None:
        raise TypeError(
            'progress() needs a bar: kind=True, "tqdm", "rich" or a callable(done, total)'
        )
    return Progress(futures, counter)
