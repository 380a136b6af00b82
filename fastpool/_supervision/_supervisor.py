"""Worker processes: spawning through the template, pidfds, timers, liveness,
memory, kills, and what happens to a dead worker's tasks.

    supervisor thread (selector)                      the thread that drives results
    ----------------------------                      -----------------------------
    template conn: ("pid", req, pid) + pidfd          on_attention (board flag):
                   ("exit", pid, code)                  for each death: drain its result ring,
    pidfd readable -> death queued, board flagged ----->  take its tasks; the one it ran is
    timers: restart (backoff, breaker), respawn           judged (_verdict): retried once
            (after a verdict), start deadline             (pure=True) or failed; the others
    liveness: task timeouts, heartbeats -> kill           go back to the queue front; the
    memory: owned bytes vs memory_limit -> kill;          slot backs off (or not: a verdict)
            leak -> retire; pressure -> pause

The supervisor reaches the dispatcher through eight methods (slot_spawned,
slot_stopping, set_accepting, slot_view, task_on, settle_death, set_paused,
set_circuit) and is reached back through three (``on_event`` with a typed
SlotEvent, ``on_attention``, ``circuit_error``), which the dispatcher calls with
none of its locks held.  A death reaches the dispatcher in one call,
``settle_death(slot, judge)``: ``_judge`` decides each task's Fate (_deaths: the
facts, the victim, the fates; _verdict: the cause).  The checks of live workers
(_watch) return decisions that this module carries out; each slot's record is _slot.
The memory tick (which workers to sample, memory kills and retirements, the pressure
pause, the parent's arena trim) is _memory_tick's, on this module's thread; ending the
workers (stop, interrupt, terminate, the wait for their exit) is _teardown's.
Lock order: the supervisor's lock, then (inside dispatcher methods) the
dispatcher's.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import selectors
import signal
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from fastpool import errors, telemetry
from fastpool._runtime import _codec, _template
from fastpool._runtime._events import Fate, Happened, SlotEvent
from fastpool._runtime._lazy import LazyModule
from fastpool._supervision import _policy
from fastpool._supervision._memory_tick import TRIM_WAKE_BYTES, MemoryTick
from fastpool._supervision._slot import Slot, select_read, stats_row

if TYPE_CHECKING:
    from fastpool._supervision import _deaths, _verdict, _watch
    from fastpool._supervision._verdict import Cause, Kill
else:
    # What judges deaths and times tasks (and _memory_tick's readers): imported at first
    # use (a death, a task to time, the first memory tick), off a first pool's path to its
    # first result (~2.5 ms of imports, measured).
    _deaths = LazyModule("fastpool._supervision._deaths")
    _verdict = LazyModule("fastpool._supervision._verdict")
    _watch = LazyModule("fastpool._supervision._watch")

log = logging.getLogger("fastpool")

EXIT_STATUS_WAIT_S = 1.0
# How long the thread keeps its timers after the last task settled before it sleeps
# (until a submit, a death, the template or a timer wakes it): calls under this apart
# never pay the wake.  Each tick of it costs ~0.2 ms of CPU (a thread's wake, here), so
# 1 s of them was ~2 ms/s of an idle pool's first second.  The workers that just ran get
# their last memory samples whatever this is (see _watching: unsampled()).
IDLE_LINGER_S = 0.2
_reqs = itertools.count(1)


LIVENESS_TICK_S = 0.1  # how often running tasks' timeouts and heartbeats are looked at
QUIET_TICK_S = 0.5  # the thread's tick with neither timeouts nor memory to watch sooner


def tick_s(
    task_timeout: float | None, hang_timeout: float | None, memory_interval_s: float
) -> float:
    """How long the supervisor's thread may sleep while it watches running tasks: the
    timeouts' pace if there are any, and never longer than ``memory_interval_s`` (a
    memory check is due each time that passes)."""
    t = LIVENESS_TICK_S if (task_timeout or hang_timeout) else QUIET_TICK_S
    return min(t, memory_interval_s)


class Supervisor:
    """Owns the worker processes of one pool.  See the module docstring.

    ``settings`` holds the pool's supervision options: task_timeout,
    hang_timeout, start_timeout, memory_limit, memory_interval_s, leak_threshold,
    min_available (bytes, or a fraction of memory until the first check), available_memory
    (a callable)."""

    def __init__(
        self,
        nslots: int,
        board: Any,
        arena: Any,
        disp: Any,
        tel: telemetry.Telemetry,
        init_payload: bytes,
        settings: dict[str, Any],
        breaker_factory: Callable[[], _policy.SlotBreaker],
    ) -> None:
        self.board = board
        self.arena = arena
        self.disp = disp
        self.tel = tel
        self.init_payload = init_payload
        self.settings = settings
        self.slots = [Slot(i, breaker_factory()) for i in range(nslots)]
        self.lock = threading.RLock()
        self.stopping = False
        self.forced = False  # terminate_workers/kill_workers: nothing starts or runs again
        self._deaths: deque[tuple[int, int, int | None]] = deque()
        self._timers: list[tuple[float, int, str, int]] = []
        self._timer_seq = itertools.count()
        self._pending_exit: dict[int, int] = {}
        self._send_lock = threading.Lock()
        self._busy_until = time.monotonic() + IDLE_LINGER_S
        self.memory = MemoryTick(self)  # samples, memory kills, the pressure pause, the trim
        self.wakeups = 0  # select returns: how often this thread woke (tests count them)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel = selectors.DefaultSelector()
        self.conn = _template.template().connect()
        self.sel.register(self.conn, selectors.EVENT_READ, ("conn", -1))
        self.sel.register(self._wake_r, selectors.EVENT_READ, ("wake", -1))
        # an array of the parent's region freed while this thread sleeps wakes it for
        # the trim (the arena owns the dup: a Block may outlive this object)
        arena.wake_on_free(os.dup(self._wake_w), TRIM_WAKE_BYTES)

    # ---- spawning ------------------------------------------------------------------

    def spawn_all(self) -> None:
        now = time.monotonic()
        with self.lock:
            for slot in self.slots:
                self._spawn(slot, now)

    def _spawn(self, slot: Slot, now: float) -> None:
        """Asks the template for a worker in this slot (supervisor lock held)."""
        try:
            self.arena.check_region(slot.id + 1)
        except errors.SegmentCorrupt as exc:  # whatever its last owner left: whole again first
            lost = self.arena.reset_region(slot.id + 1)
            log.warning(
                "fastpool: worker %d's arena region was damaged (%s); repaired, quarantining "
                "%d bytes",
                slot.id,
                exc,
                lost,
            )
        slot.req = next(_reqs)  # unique across slots and pools: the reply, and K_INIT, carry it
        self.disp.slot_spawned(slot.id, self.init_payload, slot.req)  # rings reset, K_INIT queued
        slot.state = "starting"
        slot.init_error = None
        slot.spawned_at = now
        slot.start_deadline = now + self.settings["start_timeout"]
        slot.kill = None
        slot.kill_pending = False
        slot.pid = None
        slot.cur_seen, slot.hb_seen, slot.served_seen = 0, -1, -1
        slot.mem, slot.cg, slot.oom_before, slot.oom_last, slot.baseline, slot.cg_text = (None,) * 6
        slot.retiring = False
        # the owner's multiprocessing authkey, which a forked child would inherit: Manager
        # proxies in initargs or arguments authenticate with it (no multiprocessing imported
        # here: no proxy, and a first pool does not pay for the import)
        mp = sys.modules.get("multiprocessing.process")
        env = {"FASTPOOL_AUTHKEY": bytes(mp.current_process().authkey).hex()} if mp else {}
        msg, fds = ("spawn", slot.req, slot.id, env), [self.board.fileno(), self.arena.fileno()]
        lost: list[Slot] = []
        slot.via = None  # not sent yet: a reconnect below does not count it as lost
        with self._send_lock:
            try:
                _template._send(self.conn, msg, fds)
            except OSError:  # the template died (its workers with it): start another
                lost = self._reconnect_template()
                _template._send(self.conn, msg, fds)
            slot.via = self.conn
        self._add_timer(slot.start_deadline, "start-deadline", slot.id)
        for other in lost:
            self._spawn(other, now)

    def _reconnect_template(self) -> list[Slot]:
        """The template's connection closed: its workers are dead too (they die with it),
        and their pidfds report it.  A new template serves the restarts.  Returns the
        slots whose start the dead template never answered (no pid came back): the
        caller asks again, at once, rather than after start_timeout."""
        try:
            self.sel.unregister(self.conn)
        except (KeyError, ValueError):
            pass
        _template.template().release(self.conn)
        lost = []
        for slot in self.slots:  # killed with their template, whether or not reaped yet
            if slot.via is self.conn and slot.live:
                self.disp.slot_stopping(slot.id)
                if slot.state == "starting" and slot.pidfd is None and slot.pid is None:
                    lost.append(slot)
        if self.stopping:
            return []
        log.error("fastpool: the worker template exited; starting a new one")
        self.conn = _template.template().connect()
        self.sel.register(self.conn, selectors.EVENT_READ, ("conn", -1))
        return lost

    # ---- hooks the dispatcher calls (no dispatcher lock held) -----------------------

    def on_event(self, ev: SlotEvent) -> None:
        """What a slot did (see _events.Happened); called with no dispatcher lock held."""
        sid, what = ev.slot, ev.what
        if what is Happened.READY:
            with self.lock:
                slot = self.slots[sid]
                if slot.state == "starting" and slot.pid in (None, ev.detail):
                    slot.pid = ev.detail  # READY can overtake the template's ("pid", ...) message
                    slot.state = "ready"
        elif what is Happened.INIT_FAILED:
            try:
                exc = _codec.decode_exception(ev.detail or b"")
            except Exception as err:  # noqa: BLE001 - a payload the worker could have scribbled
                exc = errors.InitializerError(f"undecodable initializer failure: {err!r}", sid)
            with self.lock:
                self.slots[sid].init_error = exc
        elif what is Happened.FIRST_REPLY:
            self.slots[sid].breaker.on_success()  # first reply, not spawn: see _policy
        elif what is Happened.RETIRE:
            with self.lock:
                self.retire(self.slots[sid])
        elif what is Happened.CORRUPT:
            with self.lock:
                slot = self.slots[sid]
                self.tel.count("corrupt")
                if slot.kill is None and slot.pid is not None:
                    self.kill(slot, _verdict.Kill(_verdict.Cause.CORRUPT, None, ev.detail))
        elif what is Happened.BAD_RESULT:
            log.warning(
                "fastpool: task %s (%s) returned a result that cannot be pickled; the worker "
                "is fine",
                ev.detail.id,
                ev.detail.fn_name,
            )

    def circuit_error(self) -> BaseException | None:
        """CircuitOpen while every slot's breaker is open (called under the dispatcher
        lock: reads the breakers only)."""
        is_open, retry, cause = _policy.all_open([s.breaker for s in self.slots], time.monotonic())
        return errors.CircuitOpen(retry, cause) if is_open else None

    def on_attention(self) -> None:
        """Deaths the supervisor thread queued: judged here, on the thread that holds
        the drive lock (a dead worker's result ring must be drained first)."""
        while self._deaths:
            sid, pid, exitcode = self._deaths.popleft()
            self._handle_death(sid, pid, exitcode)

    # ---- deaths ----------------------------------------------------------------------

    def _handle_death(self, sid: int, pid: int, exitcode: int | None) -> None:
        slot = self.slots[sid]
        if slot.pid != pid:
            return
        # The dispatcher settles what the worker published before it died first (no
        # supervisor lock: settling runs done-callbacks), then asks _judge.
        self.disp.settle_death(sid, lambda tasks: self._judge(slot, pid, exitcode, tasks))
        if all(s.state == "open" for s in self.slots):
            self.disp.set_circuit(self.circuit_error())

    def _judge(
        self, slot: Slot, pid: int, exitcode: int | None, tasks: list[Any]
    ) -> list[tuple[Any, Fate, BaseException | None]]:
        """Each of a dead worker's tasks to its fate: the one it ran is judged
        (_verdict), the others never started and go back to the queue."""
        with self.lock:
            if slot.pid != pid:
                return _deaths.requeue_all(tasks)
            try:
                self.arena.reclaim(slot.id)  # the dead worker's references on shared blocks
            except errors.SegmentCorrupt:
                self._repair_arena(dead=slot.id)
            current = self.board.current(slot.id)
            kill, slot.kill = slot.kill, None
            fates: list[tuple[Any, Fate, BaseException | None]] = []
            if kill is not None and kill.cause is _verdict.Cause.CORRUPT:
                fates, tasks = _deaths.corrupt_fates(tasks, slot.id, pid, kill.detail), []
            # a call addressed to this worker that never reached its ring is no victim
            sent = [t for t in tasks if t.t_dispatch]
            victim = _deaths.victim_of(sent, current, kill, exitcode, self.stopping)
            held = [t for t in tasks if t is not victim]
            planned = self.stopping or self.forced or (kill is not None and kill.cause.planned)
            if self.forced:
                how = kill.detail if kill is not None else "the pool's workers were stopped"
                fates += _deaths.dropped_fates(held, slot.id, pid, how)
            else:  # never started: back to the front (addressed calls: see requeue_held)
                retired = kill is not None and kill.cause is _verdict.Cause.RETIRED
                follow = retired and victim is None and not self.stopping
                fates += _deaths.requeue_held(held, slot.id, pid, exitcode, follow)
            if planned and victim is None:
                slot.state, slot.pid, slot.retiring = "dead", None, False
                if kill is not None and kill.cause is _verdict.Cause.RETIRED and not self.stopping:
                    self.tel.count("recycled")
                    self._spawn(slot, time.monotonic())  # a planned exit: no backoff, no breaker
                return fates
            death = self._death_facts(slot, pid, exitcode, kill)
            facts = _deaths.task_facts(victim) if victim is not None else None
            cause, detail = _verdict.cause_of(death, facts)
            result = _verdict.outcome(cause, facts) if facts is not None else None
            self.tel.count("killed" if cause.by_fastpool else "crashed")
            rec = _verdict.record(death, cause, detail, facts, result)
            self.tel.crash(rec)
            if victim is not None and facts is not None:
                fates.append(_deaths.victim_fate(victim, death, cause, detail, facts, result))
            if self.forced:
                slot.pid, slot.state = None, "dead"
                restart = "no replacement starts"
            elif cause.verdict:
                # The worker was healthy; fastpool stopped it for its task.
                slot.pid, slot.state = None, "backing_off"
                self._add_timer(time.monotonic(), "respawn", slot.id)
                restart = "a replacement starts now"
            else:
                restart = self._schedule_restart(
                    slot, cause, detail or rec.get("signal") or str(exitcode)
                )
            level, text = _verdict.sentence(death, cause, detail, facts, result, restart)
            log.log(level, text)
            return fates

    def _death_facts(
        self, slot: Slot, pid: int, exitcode: int | None, kill: Kill | None
    ) -> _verdict.Death:
        return _deaths.death_facts(
            slot=slot.id,
            pid=pid,
            exitcode=exitcode,
            kill=kill,
            starting=slot.state == "starting",
            init_error=slot.init_error,
            mem=slot.mem,
            cg=slot.cg,
            oom_before=slot.oom_before,
            memory_limit=self.settings["memory_limit"],
            age_s=time.monotonic() - slot.spawned_at,
            served=self.disp.slot_view(slot.id)[2],
        )

    def _repair_arena(self, dead: int) -> None:
        """Some process wrote over arena block headers.  A dead worker's region, and the
        parent's own, are made whole here (their owners are not allocating); a live
        worker's damaged region costs that worker: it is killed, and its region is
        made whole before its replacement starts (see _spawn)."""
        for region, exc in self.arena.corrupt_regions().items():
            owner = self.slots[region - 1] if region > 0 else None
            if owner is not None and owner.id != dead and owner.live and owner.pid is not None:
                if owner.kill is None:
                    self.tel.count("corrupt")
                    self.kill(
                        owner,
                        _verdict.Kill(
                            _verdict.Cause.CORRUPT,
                            None,
                            f"its arena region is damaged: {exc.detail}",
                        ),
                    )
                continue
            lost = self.arena.reset_region(region)
            log.warning(
                "fastpool: the shared arena's region %d was written over (%s); it was repaired, "
                "quarantining %d bytes",
                region,
                exc,
                lost,
            )

    def _schedule_restart(self, slot: Slot, cause: Cause, detail: str) -> str:
        slot.pid = None
        action, at = slot.breaker.on_failure(time.monotonic(), f"{cause.value}: {detail}")
        slot.state = "open" if action == "open" else "backing_off"
        if action == "open" and all(s.state == "open" for s in self.slots):
            # submits raise CircuitOpen from now on, not only once the death that
            # opened the last breaker is settled (_handle_death then drains the queue)
            self.disp.set_circuit(self.circuit_error(), drain=False)
        self._add_timer(at, "restart", slot.id)
        wait = max(0.0, at - time.monotonic())
        if action == "open":
            return (
                f"its slot failed {slot.breaker.failures} times in a row, so it rests for "
                f"{wait:.0f} s"
            )
        return f"a replacement starts in {wait * 1000:.0f} ms"

    def retire(self, slot: Slot) -> None:
        """Asks an idle worker to exit between tasks; its death spawns the replacement."""
        if slot.kill is not None or slot.pid is None:
            return
        slot.kill = _verdict.Kill(_verdict.Cause.RETIRED)
        self.disp.slot_stopping(slot.id)
        if not self.board.push_control(slot.id, _codec.K_STOP):
            self.kill(slot, _verdict.Kill(_verdict.Cause.RETIRED))

    def kill(self, slot: Slot, reason: Kill) -> None:
        """SIGKILLs the slot's worker; reason says why (the death is judged by it)."""
        slot.kill = reason
        self.disp.slot_stopping(slot.id)
        slot.kill_pending = slot.pidfd is None
        if slot.pidfd is not None:
            try:
                signal.pidfd_send_signal(slot.pidfd, signal.SIGKILL)
            except (ProcessLookupError, OSError):
                pass

    def kill_for_cancel(self, sid: int, wire: int) -> None:
        with self.lock:
            slot = self.slots[sid]
            if slot.kill is None:
                self.kill(slot, _verdict.Kill(_verdict.Cause.CANCELLED, wire, "cancelled by force"))

    # ---- the supervisor thread ------------------------------------------------------

    def run(self) -> None:
        while not self.stopping:
            try:
                self._once()
            except Exception:  # noqa: BLE001 - the supervisor must outlive any one failure
                if self.stopping:
                    return
                log.exception("fastpool supervisor: an iteration failed; going on")
                time.sleep(0.01)

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _once(self) -> None:
        # The template's end of file first: its workers die with it (PDEATHSIG), and
        # none of them may be given a task between one's death and the next's.
        events = sorted(self.sel.select(self._next_timeout()), key=lambda e: e[0].data[0] != "conn")
        self.wakeups += 1
        for key, _ in events:
            what, sid = key.data
            if what == "conn":
                self._read_template()
            elif what == "wake":
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            elif what == "pidfd":
                self._on_pidfd(sid, key.fileobj)  # type: ignore[arg-type]
        self._run_timers()
        self._check_liveness()
        self.memory.tick()

    def _next_timeout(self) -> float | None:
        s = self.settings
        t: float | None = tick_s(s["task_timeout"], s["hang_timeout"], s["memory_interval_s"])
        if not self._watching(time.monotonic()):
            t = None  # nothing to time or sample: sleep until woken
        with self.lock:
            timers = self._timers
            while (
                timers
                and timers[0][2] == "start-deadline"
                and (self.slots[timers[0][3]].state != "starting")
            ):
                heapq.heappop(timers)  # that worker started: no reason to wake then
            if timers:
                due = max(0.0, timers[0][0] - time.monotonic())
                t = due if t is None else min(t, due)
        return t

    def _watching(self, now: float) -> bool:
        """Whether liveness and memory need this thread's ticks: a task is in flight, a
        worker starts or has not been sampled since its last task, the last task ended
        under IDLE_LINGER_S ago, or the parent's arena region awaits its trim after it
        or since blocks of it were dropped (a freed pool.share array: once asleep, such
        a drop wakes this thread through the arena, MemoryTick.may_sleep).  False only
        once the dispatcher promised to wake us (``wake``) when it accepts a task: that
        promise is made before the last look at inflight, and the dispatcher checks it
        after its insert (both under the GIL)."""
        disp = self.disp
        if disp.inflight or self.memory.unsampled():
            self._busy_until = now + IDLE_LINGER_S
            return True
        if now < self._busy_until or self.memory.trim_waiting() or not self.memory.may_sleep():
            return True
        disp.idle_watch = True
        if disp.inflight:
            disp.idle_watch = False
            self._busy_until = now + IDLE_LINGER_S
            return True
        return False

    def _read_template(self) -> None:
        if not select_read(self.conn, 0):
            return  # the event was stale: _on_pidfd already read this message
        try:
            msg, fds = _template._recv(self.conn)
        except OSError:
            msg, fds = None, []
        if msg is None:
            with self.lock:
                lost = self._reconnect_template()
                for slot in lost:
                    self._spawn(slot, time.monotonic())
            return
        if msg[0] == "pid":
            _, req, pid = msg
            pidfd = fds[0] if fds else None
            with self.lock:
                for slot in self.slots:
                    if (
                        slot.req == req
                        and slot.live
                        and slot.pidfd is None
                        and slot.pid in (None, pid)
                    ):
                        slot.pid = pid
                        slot.pidfd = pidfd
                        if pidfd is not None:
                            self.sel.register(pidfd, selectors.EVENT_READ, ("pidfd", slot.id))
                            if slot.kill_pending and slot.kill is not None:
                                # decided before its pid arrived (it went READY first): carry it out
                                self.kill(slot, slot.kill)
                        break
                else:
                    # A reply no slot waits for (its start timed out, or the slot moved
                    # on): that worker must not live unwatched.  It cannot take another
                    # start's K_INIT (each carries its own request id); kill it anyway.
                    if pidfd is not None:
                        try:
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        except (ProcessLookupError, OSError):
                            pass
                        os.close(pidfd)
        elif msg[0] == "exit":
            _, pid, code = msg
            self._pending_exit[pid] = code
        elif msg[0] == "spawn-failed":
            _, req, err, text = msg
            with self.lock:
                for slot in self.slots:
                    if slot.req == req and slot.state == "starting" and slot.pid is None:
                        self._start_failed(
                            slot, _verdict.Cause.SPAWN_FAILED, f"fork failed: {text} (errno {err})"
                        )
                        break

    def _start_failed(self, slot: Slot, cause: Cause, detail: str) -> None:
        """A start that never produced a worker: a failure of the slot (backoff, breaker)."""
        self.tel.count("spawn_failures")
        death = _verdict.Death(
            slot=slot.id,
            pid=slot.pid or 0,
            exitcode=None,
            starting=True,
            age_s=time.monotonic() - slot.spawned_at,
        )
        self.tel.crash(_verdict.record(death, cause, detail, None, None))
        # nothing is dispatched to a starting slot; whatever was goes back to the queue,
        # and a call addressed to the worker that never started fails
        pid = slot.pid or 0
        self.disp.settle_death(
            slot.id, lambda tasks: _deaths.requeue_held(tasks, slot.id, pid, None, False)
        )
        restart = self._schedule_restart(slot, cause, detail)
        level, text = _verdict.sentence(death, cause, detail, None, None, restart)
        log.log(level, text)

    def _on_pidfd(self, sid: int, pidfd: int) -> None:
        self.sel.unregister(pidfd)
        slot = self.slots[sid]
        pid = slot.pid
        deadline = time.monotonic() + EXIT_STATUS_WAIT_S
        # Only the template that forked the worker can report its status; once that
        # connection is gone (the template died, and its workers with it) stop waiting.
        while (
            pid not in self._pending_exit and time.monotonic() < deadline and slot.via is self.conn
        ):
            if not select_read(self.conn, deadline - time.monotonic()):
                break
            self._read_template()
        exitcode = self._pending_exit.pop(pid, None) if pid is not None else None
        if exitcode is None and slot.via is not self.conn:
            exitcode = -signal.SIGKILL  # PR_SET_PDEATHSIG: it died with its template
        os.close(pidfd)
        with self.lock:
            if slot.pidfd == pidfd:
                slot.pidfd = None
        if pid is not None:
            self._deaths.append((sid, pid, exitcode))
            self.board.flag_attention()

    def _add_timer(self, when: float, what: str, sid: int) -> None:
        with self.lock:
            heapq.heappush(self._timers, (when, next(self._timer_seq), what, sid))
        self.wake()

    def _run_timers(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = []
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers))
            for _, _, what, sid in due:
                if self.stopping or self.forced:
                    return
                slot = self.slots[sid]
                if what == "respawn":  # after a verdict: no breaker
                    if slot.state == "backing_off" and slot.pid is None:
                        self.tel.count("restarts")
                        self._spawn(slot, now)
                elif what == "restart":
                    if slot.state not in ("backing_off", "open") or not slot.breaker.may_restart(
                        now
                    ):
                        if slot.state == "open" and slot.breaker.retry_at:
                            self._add_timer(slot.breaker.retry_at, "restart", sid)
                        continue
                    self.tel.count("restarts")
                    self.disp.set_circuit(None)
                    self._spawn(slot, now)
                elif what == "start-deadline":
                    if (
                        slot.state == "starting"
                        and slot.start_deadline <= now
                        and slot.kill is None
                    ):
                        detail = (
                            f"no READY within start_timeout={self.settings['start_timeout']:g} s"
                        )
                        if slot.pidfd is not None:
                            self.kill(
                                slot, _verdict.Kill(_verdict.Cause.START_TIMEOUT, None, detail)
                            )
                        else:  # the spawn request itself got lost (a template that went away)
                            self._start_failed(slot, _verdict.Cause.START_TIMEOUT, detail)

    def _check_liveness(self) -> None:
        """Task timeouts and heartbeats: expiry kills the worker, judged as a verdict."""
        if self.board.closed:
            return
        now = time.monotonic()
        task_timeout, hang_timeout = self.settings["task_timeout"], self.settings["hang_timeout"]
        with self.lock:
            for slot in self.slots:
                if slot.state != "ready" or slot.pidfd is None or slot.kill is not None:
                    continue
                _, _, cur, hb, _ = self.board.slot_info(slot.id)
                if cur != slot.cur_seen:
                    slot.cur_seen, slot.cur_since = cur, now
                if hb != slot.hb_seen:
                    slot.hb_seen, slot.hb_since = hb, now
                # cur 0 (no task named): the oldest task the slot holds, if no reply of it
                # waits; the word is the worker's to write, so a task that zeroed it and
                # hangs is timed all the same, from the last reply the parent counted
                task = self.disp.task_on(slot.id, cur)
                if not cur:
                    if task is None:
                        continue  # idle, or a reply waits to be read
                    served = self.disp.slot_view(slot.id)[2]
                    if served != slot.served_seen or task.wire != slot.wire_seen:
                        slot.served_seen, slot.wire_seen, slot.cur_since = served, task.wire, now
                limit = _watch.task_limit(task, task_timeout)
                kill = _watch.liveness_kill(
                    now, cur or task.wire, slot.cur_since, slot.hb_since, limit, hang_timeout
                )
                if kill is not None:
                    self.kill(slot, kill)

    def await_started(self, deadline: float) -> None:
        """Reads the template's replies until every start sent to it has its pidfd (or the
        deadline passes, or the template is gone: its workers died with it)."""
        conn = self.conn
        # A worker whose death _on_pidfd already queued has no pidfd either, but its reply
        # came long ago: waiting for it cost every such shutdown the whole stop grace.
        dead = {sid for sid, _pid, _code in self._deaths}
        while any(
            s.live and s.pidfd is None and s.via is conn and s.id not in dead for s in self.slots
        ):
            try:
                if not select_read(conn, max(0.0, deadline - time.monotonic())):
                    return
                self._read_template()
            except (OSError, ValueError):  # released by _reconnect_template: no replies come
                return
            if self.conn is not conn:
                return

    def close(self) -> None:
        self.arena.wake_on_free(-1)
        self.sel.close()
        _template.template().release(self.conn)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ---- views -------------------------------------------------------------------

    def pids(self) -> list[int]:
        return [s.pid for s in self.slots if s.pid is not None and s.live]

    def submit_to_live(self, fn: Any, args: tuple, kwargs: dict) -> dict[int, Any]:
        """fn(*args, **kwargs) addressed to each live slot's worker (starting or ready),
        under the lock that judges deaths: each call reaches the worker the slot has
        now, or fails with its death (_deaths.requeue_held).  {slot: future}."""
        with self.lock:
            return {s.id: self.disp.submit_to(s.id, fn, args, kwargs) for s in self.slots if s.live}

    def worker_stats(self, board_open: bool) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for s in self.slots:
            live = s.live and board_open
            info = self.board.slot_info(s.id) if live else (0, 0, 0, 0, 0)
            out.append(stats_row(s, info, self.disp.slot_view(s.id), live, now))
        return out
