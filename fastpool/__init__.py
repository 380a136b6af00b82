"""fastpool: a supervised, zero-copy process pool for NumPy batch work.

Public names only; see README.md for the API and the table of errors.
"""

import importlib as _importlib

__version__ = "0.1.0"

CORE_ERROR: str | None = None  # why the compiled core did not load; None when it did

try:
    # import_module, not `from fastpool import _core`, whose error for a missing file
    # speaks of a "partially initialized module" and a circular import
    _importlib.import_module("fastpool._core")
    _importlib.import_module("fastpool._arena")
except ImportError as exc:  # depends on how it was installed and where Python runs from
    from fastpool import _install

    CORE_ERROR = _install.core_missing_message(exc)
    if not _install.launched_as_cli():
        raise ImportError(CORE_ERROR) from None  # the message carries Python's own words
    # `python -m fastpool`: the CLI prints CORE_ERROR itself (doctor lists it as a
    # finding) instead of a traceback; nothing below can import without the core.
    del exc

    def __getattr__(name: str) -> object:
        if name.startswith("_"):  # submodules: `from fastpool import _sizing` must still work
            raise AttributeError(name)
        raise ImportError(CORE_ERROR)

else:
    from fastpool._codec import transfer
    from fastpool._template import shutdown_template
    from fastpool._call import TaskFunction, cancelled
    from fastpool.errors import (
        BrokenPool,
        CircuitOpen,
        DetachedBufferError,
        FastPoolError,
        InitializerError,
        PoisonTask,
        PoolClosed,
        QueueFull,
        RemoteError,
        SegmentCorrupt,
        SerializationError,
        SharedMemoryError,
        TaskTimeout,
        WorkerCrashed,
        WorkerHung,
        WorkerMemoryError,
    )
    from fastpool._progress import progress
    from fastpool.pool import Pool, PoolOptions, task

    __all__ = [
        "Pool",
        "PoolOptions",
        "TaskFunction",
        "task",
        "cancelled",
        "progress",
        "transfer",
        "shutdown_template",
        "FastPoolError",
        "BrokenPool",
        "WorkerCrashed",
        "PoisonTask",
        "WorkerHung",
        "WorkerMemoryError",
        "InitializerError",
        "TaskTimeout",
        "CircuitOpen",
        "PoolClosed",
        "QueueFull",
        "SerializationError",
        "RemoteError",
        "DetachedBufferError",
        "SharedMemoryError",
        "SegmentCorrupt",
        "__version__",
    ]
