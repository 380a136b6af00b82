"""A worker's traceback shows the source line of code defined in a notebook cell, as
ProcessPoolExecutor's does for a script (issue 15, section 5). The cell is compiled under a
file name that exists nowhere on disk and registered in the parent's linecache, as IPython
does: the worker cannot read it, the parent fills it in."""

from __future__ import annotations

import linecache

import fastpool

CELL_FILE = "/tmp/ipykernel_0/fastpool-no-such-cell-0.py"
CELL = "def calibrate(x):\n    raise ValueError(f'cannot calibrate {x}')  # cell line 2\n"


def test_a_notebook_cells_source_line_shows_in_the_worker_traceback():
    linecache.cache[CELL_FILE] = (len(CELL), None, CELL.splitlines(True), CELL_FILE)
    ns: dict = {"__name__": "__main__"}
    exec(compile(CELL, CELL_FILE, "exec"), ns)
    try:
        with fastpool.Pool(1) as pool:
            exc = pool.submit(ns["calibrate"], 3).exception(timeout=60)
    finally:
        linecache.cache.pop(CELL_FILE, None)
    assert isinstance(exc, ValueError)
    tb = exc.__cause__.tb
    assert f'File "{CELL_FILE}", line 2' in tb
    assert "raise ValueError(f'cannot calibrate {x}')  # cell line 2" in tb
