"""The Pool constructor's options: each checked once, then turned into what the
runtime takes (the worker count, the queue bound, the supervision settings).

Raises ValueError or TypeError naming the option and what it accepts; nothing is
started before every option passed.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from fastpool._native._core import check_ring_bytes
from fastpool._supervision import _sizing


class Checked(NamedTuple):
    workers: int
    max_queue: int
    settings: dict[str, Any]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_seconds(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


def check(
    *,
    workers: Any,
    max_workers: Any,
    initializer: Callable[..., object] | None,
    on_full: str,
    ring_bytes: int,
    max_queue: Any,
    max_tasks_per_worker: Any,
    blas_threads: Any,
    max_failures: Any,
    task_timeout: Any,
    hang_timeout: Any,
    queue_timeout: Any,
    start_timeout: Any,
    memory_interval_s: Any,
    backoff_base_s: Any,
    backoff_cap_s: Any,
    breaker_open_s: Any,
    memory_limit: Any,
    leak_threshold: Any,
    min_available_memory: Any,
) -> Checked:
    """Pool's options checked (see docs/api.md): ``workers=None`` or ``"auto"`` sized to
    the usable CPUs and, with ``memory_limit``, to the memory."""
    if max_workers is not None:
        if workers is not None:
            raise TypeError("pass workers or max_workers (its ProcessPoolExecutor name), not both")
        if _is_int(max_workers) and max_workers <= 0:  # ProcessPoolExecutor's words
            raise ValueError("max_workers must be greater than 0")
        workers = max_workers
    limit = _sizing.parse_memory(memory_limit) if memory_limit is not None else None
    if workers is None or workers == "auto":
        workers = _sizing.default_workers(limit)  # with a budget: never more than memory allows
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive int or 'auto', not {workers!r}")
    if workers > 1023:
        raise ValueError(f"workers must be at most 1023, not {workers}")
    if on_full not in ("block", "reject"):
        raise ValueError(f"on_full must be 'block' or 'reject', not {on_full!r}")
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be callable")
    check_ring_bytes(ring_bytes)
    max_queue = 256 * workers if max_queue is None else max_queue
    if not _is_int(max_queue) or max_queue < 1 or max_queue > 1 << 40:
        raise ValueError(f"max_queue must be an int from 1 to 2**40, not {max_queue!r}")
    for name, count in (
        ("max_tasks_per_worker", max_tasks_per_worker),
        ("blas_threads", blas_threads),
        ("max_failures", max_failures),
    ):
        if count is not None and (not _is_int(count) or count < 1):
            raise ValueError(
                f"{name} must be a positive int{'' if name == 'max_failures' else ' or None'}, "
                f"not {count!r}"
            )
    for name, value in (
        ("task_timeout", task_timeout),
        ("hang_timeout", hang_timeout),
        ("queue_timeout", queue_timeout),
    ):
        if value is not None and not _is_seconds(value):
            raise ValueError(f"{name} must be a positive number of seconds or None, not {value!r}")
    for name, value in (
        ("start_timeout", start_timeout),
        ("memory_interval_s", memory_interval_s),
        ("backoff_base_s", backoff_base_s),
        ("backoff_cap_s", backoff_cap_s),
        ("breaker_open_s", breaker_open_s),
    ):
        if not _is_seconds(value):
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")

    settings = dict(
        task_timeout=task_timeout,
        hang_timeout=hang_timeout,
        start_timeout=start_timeout,
        memory_limit=limit,
        memory_interval_s=memory_interval_s,
        leak_threshold=_sizing.parse_memory(leak_threshold) if leak_threshold is not None else None,
        # a fraction stays one until the supervisor's first memory check: reading /proc and
        # the cgroup files here cost a first pool ~1 ms on its way to a first result
        min_available=(
            _sizing.check_memory(min_available_memory) if min_available_memory is not None else None
        ),
        available_memory=_sizing.AvailableMemory(),
    )
    return Checked(workers, max_queue, settings)
