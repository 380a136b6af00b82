"""Type stubs for fastpool/_runtime/_serve.pyx (compiled): the worker's task loop."""

from fastpool._native._core import Board

TRIM_IDLE_SLICES: int
TRIM_CHURN_BYTES: int
TRIM_WINDOW: int
EXIT_STOPPED: int
EXIT_RESULT_STUCK: int
EXIT_TASK_RING_CORRUPT: int
EXIT_ARENA_CORRUPT: int

def in_task() -> bool: ...
def serve(board: Board, slot: int, parent_pid: int, spin_s: float, pop_slice_s: float) -> int: ...
