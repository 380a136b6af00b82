"""Worker-side functions for the template tests (tests/faults/test_template_*.py)."""

from __future__ import annotations

import logging
import os


def log_lines(n: int, width: int = 200) -> int:
    """Logs n lines through whatever handlers the root logger has in this worker."""
    log = logging.getLogger("fastpool-test.task")
    for i in range(n):
        log.info("%d %s", i, "x" * width)
    return os.getpid()


def root_handler_count() -> int:
    return len(logging.getLogger().handlers)


def blas_matmul(n: int) -> float:
    import numpy as np

    a = np.ones((n, n))
    return float((a @ a)[0, 0])
