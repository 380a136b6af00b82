"""NumPy's allocator hook in real workers (fastpool/_native/_alloc.pyx): a worker's new
array is made in its arena region and reaches the parent without a copy, and nothing
about the array changes.

"Without a copy" is checked, not assumed: each task returns where its array's bytes sit in
the arena, and the parent compares that with where its own view of the result sits."""

from __future__ import annotations

import _arrays
import numpy as np
from conftest import make_pool

from fastpool._native import _alloc, _ndarray

RESULT_S = 60
N = 1 << 18  # float64: 2 MiB, over the hook's 1 MiB threshold


def _where(pool, arr: np.ndarray) -> int:
    return _ndarray.address_of(arr) - pool._arena.base_address


def test_a_new_result_array_reaches_the_parent_without_a_copy(pool):
    arr = np.arange(N, dtype=np.float64)
    out, where = pool.submit(_arrays.double_where, arr).result(timeout=RESULT_S)
    assert np.array_equal(out, arr * 2)
    assert _where(pool, out) == where


def test_a_view_of_a_new_array_is_sent_as_a_view(pool):
    arr = np.arange(N, dtype=np.float64)
    out, where = pool.submit(_arrays.double_view, arr).result(timeout=RESULT_S)
    assert np.array_equal(out, (arr * 2)[1::2])
    assert _where(pool, out) == where


def test_arrays_in_containers_are_sent_without_a_copy(pool):
    arr = np.arange(N, dtype=np.float64)
    got = pool.submit(_arrays.double_in_containers, arr).result(timeout=RESULT_S)
    b, label = got["items"]
    assert (
        np.array_equal(got["a"], arr * 2) and np.array_equal(b, (arr * 3)[::2]) and label == "label"
    )
    assert (_where(pool, got["a"]), _where(pool, b)) == got["where"]


def test_the_same_array_twice_in_a_result_is_copied_and_correct(pool):
    arr = np.arange(N, dtype=np.float64)
    first, second, where = pool.submit(_arrays.double_twice, arr).result(timeout=RESULT_S)
    assert np.array_equal(first, arr * 2) and np.array_equal(second, arr * 2)
    assert where not in (
        _where(pool, first),
        _where(pool, second),
    )  # held twice: not the result's alone


def test_an_array_the_worker_keeps_is_copied_and_later_changes_do_not_reach_the_parent():
    arr = np.arange(N, dtype=np.float64)
    with make_pool(1) as p:
        out, where = p.submit(_arrays.double_and_keep, arr).result(timeout=RESULT_S)
        assert _where(p, out) != where
        assert (
            p.submit(_arrays.scale_kept, 10.0).result(timeout=RESULT_S) == 20.0
        )  # the global is valid
        assert out[1] == 2.0  # the parent's copy did not move with it
        assert p.submit(_arrays.drop_kept).result(timeout=RESULT_S) == 1
        assert p.submit(_arrays.hook_stats).result(timeout=RESULT_S)["live"] == 0


def test_an_array_made_in_a_task_thread_is_copied_and_correct(pool):
    arr = np.arange(N, dtype=np.float64)
    assert np.array_equal(
        pool.submit(_arrays.double_in_a_thread, arr).result(timeout=RESULT_S), arr * 2
    )


def test_no_block_leaks_once_results_are_dropped():
    arr = np.arange(N, dtype=np.float64)
    with make_pool(2) as p:
        results = [p.submit(_arrays.double_where, arr).result(timeout=RESULT_S) for _ in range(4)]
        results += [
            p.submit(_arrays.double_in_containers, arr).result(timeout=RESULT_S) for _ in range(2)
        ]
        assert p.submit(_arrays.temporaries, arr).result(timeout=RESULT_S) == 5 * arr.sum()
        assert p._arena.usage()["live_blocks"] > 0
        del results
        assert p._arena.usage()["live_blocks"] == 0
        for _ in range(4):  # every worker: no hook array left alive
            assert p.submit(_arrays.hook_stats).result(timeout=RESULT_S)["live"] == 0


def test_a_full_arena_falls_back_to_malloc():
    n = 4 << 20  # 32 MiB arrays; the hook may commit 2 MiB of this 4 MiB arena
    with make_pool(1, arena_bytes=4 << 20) as p:
        assert p.submit(_arrays.temporaries_of, n).result(timeout=RESULT_S) == 5 * n
        stats = p.submit(_arrays.hook_stats).result(timeout=RESULT_S)
        assert stats["installed"] and stats["fallbacks"] >= 2 and stats["live"] == 0


def test_a_task_that_forks_keeps_the_workers_blocks():
    arr = np.arange(N, dtype=np.float64)
    with make_pool(1) as p:
        got = p.submit(_arrays.fork_then_report, arr).result(timeout=RESULT_S)
    assert got == {"child_used_malloc": True, "live_before": 1, "live_after": 1, "intact": True}


def test_the_parent_never_allocates_through_the_hook(pool):
    assert pool.submit(_arrays.hook_stats).result(timeout=RESULT_S)["installed"]
    assert not _alloc.stats()["installed"] and _alloc.adopt(np.ones(N)) is None
