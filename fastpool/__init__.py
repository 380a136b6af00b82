"""fastpool: a supervised, zero-copy process pool for NumPy batch work.

Public names only; see README.md for the API and the table of errors.
"""

__version__ = "0.1.0"

try:
    from fastpool import _core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on how it was installed
    raise ImportError(
        "fastpool's compiled core (fastpool._core) is missing. Install the package with "
        "`pip install .` (or `pip install -e .` for development) so the Cython extension is "
        f"built; a plain source checkout on sys.path is not enough. ({exc})"
    ) from exc

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
from fastpool.pool import Pool, PoolOptions, task

__all__ = [
    "Pool",
    "PoolOptions",
    "TaskFunction",
    "task",
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
    "__version__",
]
