"""What a fastpool child runs for ``fastpool.dask``: a map chunk, and how it fails.

This module is imported inside fastpool's workers, so it imports neither Dask nor
the pool machinery: a replacement child pays only for what its serving loop
already loaded (``_runtime._call``).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from fastpool._runtime._call import ChunkFailure, run_chunk


def apply_items(
    fn: Callable[..., Any], items: list, star: bool
) -> tuple[list | ChunkFailure, float]:
    """``[fn(*item) if star else fn(item) for item in items]`` and its run time in seconds.

    ``fn`` is an argument here, which the pool's codec ships as it ships every
    function, a lambda or one from the client's ``__main__`` included.

    The run time lets the client size the next chunks when the input has no length.
    The chunk runs as a pool worker runs one (``_call.run_chunk``): the first item
    that raises stops it, and a ``ChunkFailure`` (the results so far, then the
    error, encoded so that an unpicklable one arrives as ``RemoteError``) comes
    back in place of the list."""
    t0 = time.perf_counter()
    out = run_chunk(fn, items, star)
    return out, time.perf_counter() - t0
