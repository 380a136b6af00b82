"""With a progress bar and no chunksize, map counts items as they finish: the chunks are
small enough that the bar moves by at most 1% at a time (issue 15, section 5: it moved in
jumps of ceil(n / 16), so tasks of 2 s showed 0% for 14 s)."""

from __future__ import annotations

import _tasks
import pytest

import fastpool

N = 400


@pytest.mark.parametrize("kind", ["map", "imap_unordered"])
def test_progress_moves_by_at_most_one_percent(kind: str) -> None:
    seen: list[int] = []
    with fastpool.Pool(2) as pool:
        run = pool.map if kind == "map" else pool.imap_unordered
        out = list(run(_tasks.double, range(N), progress=lambda done, total: seen.append(done)))
    assert sorted(out) == [2 * i for i in range(N)]
    steps = [b - a for a, b in zip([0] + seen, seen)]
    assert seen[-1] == N and max(steps) <= N // 100, steps
