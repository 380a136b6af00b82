"""Parent-side helpers of the joblib backend's tests (tests/joblib/)."""

from __future__ import annotations

import psutil

LEAK_GRACE_S = 5.0


def workers_alive() -> set[int]:
    """fastpool's live worker processes: the children of this process's template.

    Only the template's children are counted: other tests in the same session may leave
    processes of their own (multiprocessing's forkserver lives until the interpreter
    exits) while the module fixture that asks is torn down."""
    from fastpool._runtime import _template

    out = set()
    try:
        children = psutil.Process(_template.template().pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in children:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out
