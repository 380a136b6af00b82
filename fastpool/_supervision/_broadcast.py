"""``Pool.run_on_workers``: one call addressed to every live worker, gathered by slot.

Supervisor.submit_to_live -> a call per live slot (Dispatcher.submit_to: pushed to
    that worker's ring once it is ready, ahead of the shared queue)
the caller's thread drives each future in slot order (result() drives the pool)
a death of the worker it addressed fails the call (_deaths.requeue_held); a call
    still unsettled at the deadline is cancelled by Pool.cancel's rules (no kill)
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError
from typing import Any, Callable, Literal

from fastpool import errors

OnError = Literal["raise", "return", "ignore"]


def run_on_workers(
    sup: Any,
    disp: Any,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    timeout: float | None,
    on_error: OnError,
) -> dict[int, Any]:
    if on_error not in ("raise", "return", "ignore"):
        raise ValueError(f"on_error must be 'raise', 'return' or 'ignore', not {on_error!r}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None or >= 0, not {timeout!r}")
    if disp.closed:
        raise errors.PoolClosed()
    futs = sup.submit_to_live(fn, args, kwargs)
    deadline = None if timeout is None else time.monotonic() + timeout
    out: dict[int, Any] = {}
    failed: BaseException | None = None
    for slot, fut in futs.items():
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            exc = fut.exception(left)
        except CancelledError as err:  # shutdown(cancel_futures=True) took it first
            exc = err
        except TimeoutError:
            late = [s for s, f in futs.items() if not f.done()]
            for f in futs.values():
                if not f.cancel():
                    disp.cancel(f, False)  # running: only its flag (fastpool.cancelled())
            raise TimeoutError(
                f"run_on_workers: worker slot(s) {late} did not answer within {timeout:g} s; "
                "calls not started were dropped, running ones were asked to stop"
            ) from None
        if exc is None:
            out[slot] = fut.result()
        elif on_error == "return":
            out[slot] = exc
        elif on_error == "raise" and failed is None:
            failed = exc
    if failed is not None:
        raise failed
    return out
