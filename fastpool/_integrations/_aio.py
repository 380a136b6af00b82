"""asyncio over a Pool: ``await pool.asubmit(...)`` and ``async for ... in pool.amap(...)``.

    coroutine on the event loop                     pool threads
    ---------------------------                     ------------
    Gate.admit(submit): room in the queue?
      yes: submit now (pickle, enqueue: never waits)
      no:  park in the gate's FIFO (a loop future) -- no thread blocks
    Driver.track(fut) ----------------------------> the driver thread waits on the
                                                    result rings as a thread in
                                                    result() would, and settles
    Gate._flush() <-- loop.call_soon_threadsafe --- the done-callback, Gate.post():
      once per batch of settled futures              into the gate's inbox
      the gate first admits parked submits while the queue has room (dispatch
      frees queue places BEFORE a future settles, so a settle is when room
      appears; a backoff timer covers room made by others), then the awaiting
      coroutines resume

Nothing here calls ``PoolFuture.result()`` on an unfinished future: that would
drive the pool on the loop thread and block the loop until the task ends.

Admission.  ``Pool.submit`` blocks its thread while the queue is full
(``on_full="block"``); on the loop thread that would stall every coroutine.  So
the gate checks ``queued < max_queue`` and submits in the same step (no await
between: no coroutine can take the place), and otherwise parks the caller.  An
admission semaphore would count only asyncio's own tasks, not those that
threads or ``map`` queue, and a retry loop on QueueFull needs a pool that
rejects.  One gap remains: another *thread* may fill the last place between the
check and the enqueue; the submit then waits as ``submit`` does.  A pool made
with ``on_full="reject"`` closes it: the gate treats QueueFull as "park".

Cancellation.  Cancelling the awaiting task cancels the pool task by
``Pool.cancel``'s rules: queued or prefetched, it is dropped and never runs;
running, its cancel flag is set (``fastpool.cancelled()``), or with
``force_cancel`` its worker is killed.  The awaiting task's CancelledError is
raised at once; the pool future settles as cancelled when the task stops.

Thread safety: a Gate belongs to one (pool, loop) pair; only ``post`` runs off
the loop's thread.  A Driver serves every loop of its pool and takes its lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import logging
import threading
import weakref
from collections import deque
from typing import Any, Callable, Generic, Iterable, TypeVar

from fastpool import errors
from fastpool._integrations import _progress
from fastpool._runtime import _mapper
from fastpool._runtime._call import TaskFunction

R = TypeVar("R")
log = logging.getLogger("fastpool")

ADMIT_POLL_MIN_S = 0.001  # first look again after a full queue with no settle of ours to wake us
ADMIT_POLL_MAX_S = (
    0.05  # the backoff's cap: room made by other submitters is seen this late at worst
)

DRIVER_LINGER_S = 0.5  # an idle driver thread waits this long for more work before it exits

# pool -> loop -> Gate.  Weak both ways: a Gate holds neither its pool nor its loop.
_gates: "weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, Gate]]" = (
    weakref.WeakKeyDictionary()
)
_drivers: "weakref.WeakKeyDictionary[Any, Driver]" = weakref.WeakKeyDictionary()
_drivers_lock = threading.Lock()


class Driver:
    """A thread that drives the pool while coroutines await its futures.

    A thread in ``result()`` consumes the result rings itself (spin, then a futex
    wait) and settles at once.  The event loop cannot wait like that, and the
    collector thread, which settles what nobody waits for, holds back for a
    moment after each submit (so that a waiting caller's round trip wakes no
    second thread): every asubmit would pay that pause.  So while any asyncio
    future of this pool is pending, this thread waits as a caller would; it
    exits after DRIVER_LINGER_S without work, or when the pool is torn down.
    It holds the pool only while it drives (pending futures keep their pool
    alive), never while idle.  Thread-safe."""

    def __init__(self, pool: Any) -> None:
        self.pool_ref = weakref.ref(pool)
        self.lock = threading.Lock()
        self.pending = 0
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()

    def track(self, fut: Any) -> None:
        """Drives the pool until fut (too) has settled; fut may be settled already."""
        with self.lock:
            self.pending += 1
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="fastpool-aio-driver", daemon=True
                )
                self.thread.start()
            else:
                self.wake.set()
        fut.add_done_callback(self._settled)

    def _settled(self, fut: Any) -> None:
        with self.lock:
            self.pending -= 1

    def _idle(self) -> bool:
        return self.pending == 0

    def _drive_once(self) -> bool:
        """Drives until idle; False when there is no pool left to drive."""
        pool = self.pool_ref()
        if pool is None or pool._torn_down():
            return False
        pool._drive(self._idle, None)
        return not pool._torn_down()

    def _run(self) -> None:
        try:
            while True:
                try:
                    if not self._drive_once():
                        return
                except Exception:  # noqa: BLE001 - the collector thread still settles everything
                    log.exception(
                        "fastpool: the asyncio driver thread failed; results now come "
                        "through the collector thread"
                    )
                    return
                with self.lock:
                    if self.pending:
                        continue
                    self.wake.clear()
                if self.wake.wait(DRIVER_LINGER_S):
                    continue
                with self.lock:
                    if not self.pending and not self.wake.is_set():
                        self.thread = None
                        return
        finally:
            with self.lock:
                if self.thread is threading.current_thread():
                    self.thread = None


def driver_of(pool: Any) -> Driver:
    drv = _drivers.get(pool)
    if drv is None:
        with _drivers_lock:
            drv = _drivers.get(pool)
            if drv is None:
                drv = _drivers[pool] = Driver(pool)
    return drv


class Gate:
    """One pool as one event loop sees it: admission to the queue (FIFO), and
    the inbox through which settled futures reach the loop, one wake-up of the
    loop per batch rather than per future."""

    def __init__(self, pool: Any) -> None:
        self.pool_ref = weakref.ref(pool)
        self.waiters: deque[tuple[asyncio.Future[Any], Callable[[], Any]]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.delay = ADMIT_POLL_MIN_S
        self.inbox: deque[tuple[Callable[[Any], None], Any]] = deque()
        self.scheduled = False

    def post(self, loop: asyncio.AbstractEventLoop, land: Callable[[Any], None], fut: Any) -> None:
        """A pool future's done-callback, on whichever thread settled it."""
        self.inbox.append((land, fut))
        if not self.scheduled:
            # Set before the call and cleared by _flush before it reads the inbox:
            # an append that sees True was made before that read.
            self.scheduled = True
            try:
                loop.call_soon_threadsafe(self._flush)
            except RuntimeError:
                pass  # the loop was closed: nobody awaits these futures any more

    def _flush(self) -> None:
        self.scheduled = False
        if self.waiters:
            self.release()  # dispatch made room before these settled: refill the queue first
        inbox = self.inbox
        while inbox:
            land, fut = inbox.popleft()
            land(fut)

    def room(self) -> bool:
        pool = self.pool_ref()
        return pool is not None and bool(pool._has_room())

    async def admit(self, submit: Callable[[], Any], pool: Any, force: bool) -> Any:
        """submit() once the queue has room; returns what it returns (a PoolFuture)."""
        if not self.waiters and self.room():
            try:
                return submit()
            except errors.QueueFull:
                pass  # a thread took the last place: park (submit(wait=False) never blocks)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        self.waiters.append((waiter, submit))
        self._arm(loop)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                pool.cancel(waiter.result(), force=force)  # admitted while we were being cancelled
            raise

    def release(self) -> None:
        """Submits for parked callers, in order, while the queue has room (loop thread)."""
        admitted = False
        while self.waiters and self.room():
            waiter, submit = self.waiters.popleft()
            if waiter.done():
                continue  # its caller was cancelled while parked: nothing was submitted
            try:
                waiter.set_result(submit())
                admitted = True
            except errors.QueueFull:
                self.waiters.appendleft((waiter, submit))
                break
            except BaseException as exc:  # noqa: BLE001 - the parked caller raises it
                waiter.set_exception(exc)
        if admitted:
            self.delay = ADMIT_POLL_MIN_S
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.waiters:
            self._arm(asyncio.get_running_loop())

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        # The backstop for room that no settle of ours announces (other submitters'
        # tasks leaving the queue); our own settles call release() directly.
        if self.timer is None:
            self.timer = loop.call_later(self.delay, self._poll)

    def _poll(self) -> None:
        self.timer = None
        self.delay = min(self.delay * 2, ADMIT_POLL_MAX_S)
        self.release()


def gate_of(pool: Any) -> Gate:
    loop = asyncio.get_running_loop()
    per_loop = _gates.get(pool)
    if per_loop is None:
        per_loop = _gates[pool] = weakref.WeakKeyDictionary()
    gate = per_loop.get(loop)
    if gate is None:
        gate = per_loop[loop] = Gate(pool)
    return gate


def _outcome(fut: Any, *, waiter: asyncio.Future[Any]) -> None:
    """Copies a settled pool future into an asyncio future (loop thread)."""
    if waiter.done():
        return
    if fut.cancelled():
        # The pool's CancelledError (an Exception), as fut.result() raises: not
        # asyncio's, which would read as a cancellation of the awaiting task itself.
        waiter.set_exception(cf.CancelledError())
        return
    exc = fut.exception()  # settled: returns at once, drives nothing
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(fut.result())


async def submit(
    pool: Any, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any, force: bool
) -> Any:
    """Pool.asubmit: admission, then the result, without blocking the loop."""
    if type(fn) is TaskFunction:
        fn, options = fn.fn, options if options is not None else fn.options
    gate = gate_of(pool)
    try:
        fut = await gate.admit(
            functools.partial(pool._submit_nowait, fn, args, kwargs, options), pool, force
        )
    except errors.CircuitOpen:
        if options is None or options.fallback != "inline":
            raise
        # Degraded mode: Pool.submit's own inline fallback, on a thread, not on the loop
        loop = asyncio.get_running_loop()
        inline = await loop.run_in_executor(None, pool._submit, fn, args, kwargs, options)
        return inline.result()
    if fut.done():
        return fut.result()  # settled while it was submitted: no round trip through the loop
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[Any] = loop.create_future()

    fut.add_done_callback(
        functools.partial(gate.post, loop, functools.partial(_outcome, waiter=waiter))
    )
    driver_of(pool).track(fut)
    try:
        return await waiter
    except asyncio.CancelledError:
        if not fut.done():
            pool.cancel(fut, force=force)
        raise


class _Landing:
    """Where an amap's settled chunks arrive (loop thread).  Apart from the
    AsyncMap, so that the futures' callbacks do not keep it alive: a dropped
    iterator is collected at once and cancels its chunks."""

    def __init__(
        self, gate: Gate, driver: Driver, loop: asyncio.AbstractEventLoop, ordered: bool
    ) -> None:
        self.gate, self.driver, self.loop, self.ordered = gate, driver, loop, ordered
        self.landed: deque[Any] = deque()  # ordered=False: settled, in settle order
        self.wakeup: asyncio.Future[None] | None = None

    def land(self, fut: Any) -> None:
        if not self.ordered:
            self.landed.append(fut)
        w = self.wakeup
        if w is not None and not w.done():
            w.set_result(None)


class AsyncMap(Generic[R]):
    """What ``Pool.amap`` returns: an async iterator of results (``async for``),
    also an async context manager whose exit closes it.

    The map engine's MapRun (``_runtime._mapper``) decides the chunks, the
    window in flight, the adaptive size and partial failure; this driver
    replaces only the waiting: each chunk is admitted through the gate, and
    settled chunks land on the loop.  Ending early (``break``, ``aclose()``,
    cancellation, an error) cancels the chunks not finished by
    ``Pool.cancel``'s rules.  Holds its pool alive.  Belongs to one task on one
    loop."""

    def __init__(
        self,
        pool: Any,
        fn: Callable[..., Any],
        iterables: tuple[Iterable[Any], ...],
        chunksize: int | None,
        ordered: bool,
        force: bool,
        progress: _progress.ProgressArg,
    ) -> None:
        self._pool, self._force, self._ordered = pool, force, ordered
        self._run = _mapper.MapRun(pool, fn, iterables, chunksize=chunksize)
        self._counter = (
            None
            if progress is None
            else _progress.open_counter(
                progress, _progress.total_of(iterables), getattr(self._run.fn, "__name__", None)
            )
        )
        self._items: Any = iter(())  # the current chunk's results
        self._error: BaseException | None = None  # a failed chunk's, after its partial results
        self._closed = False
        self._received = 0
        self._landing: _Landing | None = None

    def __aiter__(self) -> AsyncMap[R]:
        return self

    async def __aenter__(self) -> AsyncMap[R]:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.close()

    async def aclose(self) -> None:
        self.close()

    async def __anext__(self) -> R:
        for item in self._items:
            return item  # type: ignore[no-any-return]
        try:
            return await self._next_chunk()  # type: ignore[no-any-return]
        except BaseException:
            self.close()
            raise

    async def _next_chunk(self) -> Any:
        run = self._run
        while True:
            if self._error is not None:
                exc, self._error = self._error, None
                raise exc
            if self._closed:
                raise StopAsyncIteration
            await self._fill()
            if not run.pending:
                run.raise_input_error()  # the input broke after the chunks before it
                self.close()
                raise StopAsyncIteration
            results, self._error = run.take(await self._take())
            self._received += len(results)
            self._items = _mapper.hand_out(results)
            for item in self._items:
                return item

    async def _fill(self) -> None:
        landing = self._landing
        if landing is None:
            landing = self._landing = _Landing(
                gate_of(self._pool),
                driver_of(self._pool),
                asyncio.get_running_loop(),
                self._ordered,
            )
        run, pool = self._run, self._pool
        while (chunk := run.next_chunk()) is not None:
            fut = await landing.gate.admit(
                functools.partial(
                    pool._submit_chunk, run.fn, chunk, run.star, False, memo=run.memo
                ),
                pool,
                self._force,
            )
            if self._closed:  # cancelled meanwhile by close() from elsewhere
                pool.cancel(fut, force=self._force)
                return
            run.sent(fut)
            if self._counter is not None:
                fut.add_done_callback(self._counter.chunk_done)
            fut.add_done_callback(functools.partial(landing.gate.post, landing.loop, landing.land))
            landing.driver.track(fut)

    async def _take(self) -> Any:
        """The next settled chunk: the head (ordered) or any (ordered=False)."""
        landing = self._landing
        assert landing is not None
        run = self._run
        pending = run.pending
        while True:
            if self._ordered:
                head = pending[0]
                if head.done():
                    return head
                if run.first_round and run.settled:
                    # a chunk that is not the head settled: it sizes the window (one chunk
                    # per worker until now), so a worker done with its chunk gets more
                    run.observe()
                    await self._fill()
                    continue
            else:
                while landing.landed:
                    fut = landing.landed.popleft()
                    if fut in pending:
                        return fut
            landing.wakeup = landing.loop.create_future()
            await landing.wakeup

    def close(self) -> None:
        """Cancels the chunks not finished (Pool.cancel's rules) and closes the bar."""
        if self._closed:
            return
        self._closed = True
        pool, force = self._pool, self._force
        self._run.cancel_pending(lambda fut: pool.cancel(fut, force=force))
        if self._counter is not None:
            self._counter.close(self._received)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
