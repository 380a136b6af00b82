"""``with pool.arrays():`` NumPy arrays born in the pool's shared memory in the parent
(fastpool/_native/_alloc.pyx, fastpool/_runtime/_arrays.py ArraysContext).

Zero copy is proven, not assumed: a task writes into its argument and the parent reads
the write, with no result carrying it back; an array made outside the context (or one
the hook could not place) gets the by-value behaviour, where the parent never sees it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import _arrays
import numpy as np
import pytest
from _nested_tasks import shared_memory_held
from conftest import make_pool

import fastpool
from fastpool._native import _alloc

RESULT_S = 60
N = 1 << 18  # float64: 2 MiB, above the hook's 1 MiB threshold


def born_in(pool: fastpool.Pool, arr: np.ndarray) -> bool:
    return _alloc.is_hook_array(arr, pool._arena)


def test_results_are_the_same_with_and_without_the_context(pool):
    plain = np.arange(N, dtype=np.float64)
    with pool.arrays():
        shared = np.arange(N, dtype=np.float64)
        doubled_inside = shared * 2
    assert born_in(pool, shared) and born_in(pool, doubled_inside) and not born_in(pool, plain)
    want = float(plain.sum())
    assert pool.submit(_arrays.total, shared).result(timeout=RESULT_S) == want
    assert pool.submit(_arrays.total, plain).result(timeout=RESULT_S) == want
    back = pool.submit(_arrays.echo, shared[::3]).result(timeout=RESULT_S)
    assert np.array_equal(back, plain[::3]) and np.array_equal(doubled_inside, 2 * plain)


def test_an_array_made_inside_crosses_without_a_copy(pool):
    with pool.arrays() as ctx:
        arr = np.zeros(N)
    assert pool.submit(_arrays.info, arr).result(timeout=RESULT_S)["shared"]
    assert pool.submit(_arrays.add_in_place, arr, 1.0).result(timeout=RESULT_S) == N
    assert (arr == 1.0).all()  # the task's writes are the parent's bytes
    assert ctx.stats() == {"live": 1, "served": 1, "fallbacks": 0}
    plain = np.zeros(N)  # outside the context: by value, the task writes its own copy
    assert pool.submit(_arrays.add_in_place, plain, 1.0).result(timeout=RESULT_S) == N
    assert not plain.any()


def test_small_arrays_stay_with_numpy(pool):
    with pool.arrays() as ctx:
        small = np.ones(1000)
    assert not born_in(pool, small) and ctx.stats()["served"] == 0


def test_np_zeros_inside_is_zero_even_in_a_reused_block(pool):
    with pool.arrays():
        dirty = np.ones(N)
        where = dirty.ctypes.data
        del dirty
        clean = np.zeros(N)
    assert clean.ctypes.data == where and born_in(pool, clean) and not clean.any()


def test_arrays_outlive_their_pool_and_are_unmapped_with_the_last_one():
    before = shared_memory_held()
    with make_pool(1) as p:
        with p.arrays():
            arr = np.arange(N, dtype=np.float64)
        assert p.submit(_arrays.total, arr).result(timeout=RESULT_S) == float(N * (N - 1) // 2)
        arena = p._arena
    view = arr[1::2]
    del arr
    gc.collect()
    assert view[0] == 1.0 and view.sum() == float((N // 2) ** 2)  # shut down, still valid
    view[0] = 5.0  # and still writeable memory
    assert view[0] == 5.0 and shared_memory_held()[1] > before[1]
    del view, p, arena
    gc.collect()
    assert shared_memory_held() == before


def test_after_shutdown_new_arrays_fall_back_and_the_context_is_refused():
    with make_pool(1) as p:
        ctx = p.arrays()
        with ctx:
            p.shutdown(wait=True)
            late = np.ones(N)
        assert not born_in(p, late) and late.sum() == N
        assert ctx.stats()["fallbacks"] == 1
        with pytest.raises(fastpool.PoolClosed):
            p.arrays()


def test_a_full_arena_falls_back_to_numpy_and_the_array_is_sent_by_value():
    with make_pool(1, arena_bytes=16 << 20) as p:
        with p.arrays() as ctx:
            first = np.ones((8 << 20) // 8)  # 8 MiB: within the hook's share (3/4)
            second = np.ones((6 << 20) // 8)  # past the share: NumPy's own memory
        assert born_in(p, first) and not born_in(p, second)
        assert ctx.stats()["fallbacks"] == 1
        assert p.submit(_arrays.add_in_place, second, 1.0).result(timeout=RESULT_S) == 2 * len(
            second
        )
        assert (second == 1.0).all()  # copied when sent: the task changed its own copy


def test_the_context_covers_its_own_thread_only(pool):
    seen = {}
    with pool.arrays():
        t = threading.Thread(target=lambda: seen.setdefault("other", np.ones(N)))
        t.start()
        t.join()
        mine = np.ones(N)
    after = np.ones(N)
    assert born_in(pool, mine)
    assert not born_in(pool, seen["other"]) and not born_in(pool, after)


def test_a_forked_child_falls_back_and_its_writes_stay_its_own(pool):
    with pool.arrays():
        arr = np.ones(N)

        def falls_back() -> bool:
            nonlocal arr
            fresh = np.ones(N)  # the handler is inherited, the pool is not
            arr[0] = 99.0  # copy-on-write in the child
            ok = not born_in(pool, fresh) and arr.sum() == N + 98.0
            del arr
            return ok

        assert _arrays.in_forked_child(falls_back)
    assert arr[0] == 1.0 and born_in(pool, arr)
    assert pool.submit(_arrays.total, arr).result(timeout=RESULT_S) == N


def test_nested_contexts_of_two_pools_each_serve_their_own():
    with make_pool(1) as a, make_pool(1) as b:
        with a.arrays():
            in_a = np.zeros(N)
            with b.arrays():
                in_b = np.zeros(N)
            in_a_again = np.zeros(N)
        assert born_in(a, in_a) and born_in(a, in_a_again) and born_in(b, in_b)
        assert not born_in(b, in_a)
        # another pool's array is an ordinary one there: copied, never shared
        assert b.submit(_arrays.add_in_place, in_a, 1.0).result(timeout=RESULT_S) == N
        assert not in_a.any()
        assert b.submit(_arrays.add_in_place, in_b, 1.0).result(timeout=RESULT_S) == N
        assert (in_b == 1.0).all()


def test_transfer_takes_an_array_made_inside(pool):
    with pool.arrays():
        arr = np.arange(N, dtype=np.float64)
    fut = pool.submit(_arrays.double_and_transfer_back, fastpool.transfer(arr))
    with pytest.raises(fastpool.DetachedBufferError):
        arr.sum()
    back = fut.result(timeout=RESULT_S)
    assert back[-1] == 2.0 * (N - 1)


def test_an_array_from_outside_cannot_be_transferred(pool):
    with pytest.raises(TypeError, match="plain arrays are copied"):
        fastpool.transfer(np.ones(N))


EXIT_SCRIPT = """
import numpy as np
import fastpool

pool = fastpool.Pool(1)
with pool.arrays():
    KEPT = [np.ones(1 << 18), np.ones(10), np.zeros(1 << 18)[::2]]  # hook and NumPy's own
if {shut_down}:
    pool.shutdown()
print(float(KEPT[0].sum()))
"""


@pytest.mark.parametrize("shut_down", [True, False])
def test_an_interpreter_that_exits_holding_such_arrays_exits_cleanly(shut_down):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT.format(shut_down=shut_down)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, str(float(N)), "")


def test_threads_each_in_their_own_context_share_the_arena_safely(pool):
    rounds, start = 40, threading.Barrier(3)
    failures: list[str] = []

    def work(value: float) -> None:
        start.wait()
        for i in range(rounds):
            with pool.arrays():
                arr = np.full(N + i, value)
            got = pool.submit(_arrays.total, arr).result(timeout=RESULT_S)
            if not born_in(pool, arr) or got != value * (N + i) or (arr != value).any():
                failures.append(f"{value}: round {i}")

    threads = [threading.Thread(target=work, args=(v,)) for v in (1.0, 2.0, 3.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and pool._arena.usage()["live_blocks"] == 0
