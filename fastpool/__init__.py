"""fastpool: a supervised, zero-copy process pool for NumPy batch work.

Public names only; see docs/api.md for the API and docs/supervision.md for the table of errors.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

CORE_ERROR: str | None = None  # why the compiled core did not load; None when it did

try:
    # import_module, not `from fastpool._native import _core`, whose error for a missing file
    # speaks of a "partially initialized module" and a circular import
    _importlib.import_module("fastpool._native._core")
    _importlib.import_module("fastpool._native._arena")
except ImportError as exc:  # depends on how it was installed and where Python runs from
    from fastpool._runtime import _install

    CORE_ERROR = _install.core_missing_message(exc)
    if not _install.launched_as_cli():
        raise ImportError(CORE_ERROR) from None  # the message carries Python's own words
    # `python -m fastpool`: the CLI prints CORE_ERROR itself (doctor lists it as a
    # finding) instead of a traceback; nothing below can import without the core.
    del exc

    def __getattr__(name: str) -> object:
        if name.startswith(
            "_"
        ):  # sub-packages: `from fastpool._supervision import _sizing` must still work
            raise AttributeError(name)
        raise ImportError(CORE_ERROR)

else:
    from fastpool import errors as _errors
    from fastpool.errors import (
        CircuitOpen,
        DetachedBufferError,
        FastPoolError,
        PoolClosed,
        QueueFull,
        RegionCorrupt,
        RemoteError,
        SegmentCorrupt,
        SerializationError,
        SharedMemoryError,
        TaskTimeout,
    )

    # Resolved on first use (PEP 562) and then kept here, so that `import fastpool`
    # stays cheap. pool.py brings the parent's machinery
    # (supervisor, verdicts, memory sampling, sizing, the dispatcher and
    # concurrent.futures), more than half of what the package costs to import: a
    # script pays it at its first `fastpool.Pool`, and a spawned worker template,
    # which imports this package too, only if the script names the pool at its top
    # level. The BrokenPool family is made by fastpool.errors when first named (its
    # stdlib base imports multiprocessing). The call, codec and template modules
    # (TaskFunction, cancelled, transfer, shutdown_template) come with the first pool
    # too: a third of the package's own import time, paid once whichever is named
    # first. Thread-safe: the import system serialises the
    # first import, and every thread stores the same object.
    _LAZY: dict[str, str] = {
        "TaskFunction": "fastpool._runtime._call",
        "cancelled": "fastpool._runtime._call",
        "transfer": "fastpool._runtime._arrays",
        "shutdown_template": "fastpool._runtime._template",
        "pool": "fastpool.pool",
        "Pool": "fastpool.pool",
        "PoolOptions": "fastpool.pool",
        "task": "fastpool._runtime._call",
        "progress": "fastpool._integrations._progress",
        **dict.fromkeys(_errors._BROKEN_FAMILY, "fastpool.errors"),
    }

    if _typing.TYPE_CHECKING:
        from fastpool import pool  # noqa: F401 (a lazy name, see _LAZY)
        from fastpool._integrations._progress import progress
        from fastpool._runtime._arrays import transfer
        from fastpool._runtime._call import TaskFunction, cancelled, task
        from fastpool._runtime._template import shutdown_template
        from fastpool.errors import (
            BrokenPool,
            InitializerError,
            PoisonTask,
            WorkerCrashed,
            WorkerHung,
            WorkerMemoryError,
        )
        from fastpool.pool import Pool, PoolOptions

    def __getattr__(name: str) -> object:
        try:
            module = _importlib.import_module(_LAZY[name])
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_LAZY))

    __all__ = [
        "Pool",
        "PoolOptions",
        "TaskFunction",
        "task",
        "progress",
        "cancelled",
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
        "RegionCorrupt",
        "__version__",
    ]
