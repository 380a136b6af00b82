"""Tasks for tests/faults/test_map_interrupt.py: each item appends its number to a log; item
0 first announces that it runs, then waits for a gate file."""

from __future__ import annotations

import os
import time


def logged(i: int, log: str, started: str, gate: str) -> int:
    if i == 0:
        with open(started, "w"):
            pass
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)
    with open(log, "a") as f:
        f.write(f"{i}\n")
    return i
