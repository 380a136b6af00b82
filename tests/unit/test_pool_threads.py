"""A pool's own threads (supervisor, collector) start without the constructor waiting for
them to run, and joining one still waits for it to have begun."""

import threading

from fastpool._supervision._lifetime import _Thread


class _HeldAtBirth(_Thread):
    """Does not begin (no GIL taken, no ``_started`` set) until ``gate`` opens: a thread
    the scheduler has not run yet."""

    def __init__(self, gate: threading.Event, ran: list) -> None:
        super().__init__(target=ran.append, args=(1,), daemon=True)
        self.gate = gate

    def _bootstrap(self) -> None:
        self.gate.wait(30)
        super()._bootstrap()


def test_start_returns_before_the_thread_runs_and_join_waits_for_it() -> None:
    gate, ran = threading.Event(), []
    t = _HeldAtBirth(gate, ran)
    starter = threading.Thread(target=t.start, daemon=True)
    starter.start()
    starter.join(10)
    try:
        # threading.Thread.start would still be waiting here, until the gate opens
        assert not starter.is_alive(), "start() waited for the new thread to run"
        assert t in threading.enumerate() and not ran
    finally:
        gate.set()
    t.join(30)  # Thread.join alone raises "cannot join thread before it is started"
    assert ran == [1] and not t.is_alive()


def test_join_with_a_timeout_counts_the_wait_for_the_start() -> None:
    gate, ran = threading.Event(), []
    t = _HeldAtBirth(gate, ran)
    t.start()
    try:
        t.join(0.01)  # returns at its timeout: the thread has not begun
        assert t.is_alive() is False and not ran
    finally:
        gate.set()
    t.join(30)
    assert ran == [1]
