"""The worker side of the joblib backend: run one batch of ``delayed`` calls.

Only workers run this module's functions (the parent names ``run_batch`` by
reference).  The batch's functions and arguments arrive as the pool's codec ships
every call (fastpool/_runtime/_codec.py): nothing here unpickles.
"""

from __future__ import annotations

from typing import Any


def run_batch(
    fns: tuple[Any, ...],
    calls: list[tuple[int, tuple, dict]],
    nested: Any,
    n_jobs: int | None,
    backend: type,
) -> list[Any]:
    """``[fns[i](*args, **kwargs) for i, args, kwargs in calls]``, as joblib's
    ``BatchedCalls.__call__`` runs them: under the nested backend joblib chose for
    calls made inside a task.

    ``backend`` is the parent's ``FastpoolBackend`` class (its pickle names it, so
    unpickling it loaded ``fastpool.joblib`` here): a task that names
    ``backend="fastpool"`` itself finds it, and that nested Parallel call starts a
    pool of this worker's own (see ``FastpoolBackend.effective_n_jobs``)."""
    from joblib import parallel, parallel_config

    parallel.BACKENDS.setdefault("fastpool", backend)
    with parallel_config(backend=nested, n_jobs=n_jobs):
        return [fns[i](*args, **kwargs) for i, args, kwargs in calls]


def run_callable(fn: Any) -> Any:
    """A callable joblib submitted that is not a batch (another joblib version's shape)."""
    return fn()
