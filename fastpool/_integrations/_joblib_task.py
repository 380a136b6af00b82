"""The worker side of the joblib backend: run one batch of ``delayed`` calls.

Only workers import this module (the parent names ``run_batch`` by reference), so
a worker pays for joblib's import but never for the backend's pool machinery.
"""

from __future__ import annotations

from typing import Any

from fastpool._runtime._call import load_fn


def _backend(*args: Any, **kwargs: Any) -> Any:
    from fastpool.joblib import FastpoolBackend  # registers the class itself, too

    return FastpoolBackend(*args, **kwargs)


def run_batch(
    fns: tuple[Any, ...], calls: list[tuple[int, tuple, dict]], nested: Any, n_jobs: int | None
) -> list[Any]:
    """``[fns[i](*args, **kwargs) for i, args, kwargs in calls]``, as joblib's
    ``BatchedCalls.__call__`` runs them: under the nested backend joblib chose for
    calls made inside a task.  A plain function arrives as its pickle (bytes) and is
    unpickled once per worker; any other callable arrives as itself."""
    from joblib import parallel, parallel_config

    # A task that names backend="fastpool" itself finds it (and runs it sequentially,
    # see effective_n_jobs) without every worker importing the backend up front.
    parallel.BACKENDS.setdefault("fastpool", _backend)
    funcs = [load_fn(f) if type(f) is bytes else f for f in fns]
    with parallel_config(backend=nested, n_jobs=n_jobs):
        return [funcs[i](*args, **kwargs) for i, args, kwargs in calls]


def run_callable(fn: Any) -> Any:
    """A callable joblib submitted that is not a batch (another joblib version's shape)."""
    return fn()
