"""Claims about fastpool._native._alloc, NumPy's allocator hook, in one process.

A worker's view of an arena is made here with Arena.attach(fd, 1); the hook is
installed in a copy of the test's context, so NumPy's handler (a context
variable) is back to the default outside each test.  tests/integration/
test_numpy_hook.py checks the same hook inside real workers."""

from __future__ import annotations

import contextvars
import os
import threading

import numpy as np
import pytest

from fastpool._native import _alloc, _arena, _ndarray

MIB = 1 << 20


@pytest.fixture
def arenas():
    parent = _arena.Arena.create(2, 64 * MIB)
    worker = _arena.Arena.attach(parent.fileno(), 1)
    yield parent, worker
    worker.close()
    parent.close()


def in_region(arena: _arena.Arena, arr: np.ndarray) -> bool:
    lo = arena.base_address + arena.regions_offset + arena.proc * arena.region_bytes
    return lo <= _ndarray.address_of(arr) < lo + arena.region_bytes


def hooked(worker: _arena.Arena, fn, **install):
    """fn() with the hook installed for worker, in a context of its own."""

    def run():
        _alloc.install(worker, **install)
        try:
            return fn()
        finally:
            _alloc.uninstall()

    return contextvars.copy_context().run(run)


def test_large_arrays_land_in_the_own_region_and_small_ones_do_not(arenas):
    _, worker = arenas
    big, small = hooked(worker, lambda: (np.ones(MIB), np.ones(1000)))
    assert in_region(worker, big) and not in_region(worker, small)
    assert big.sum() == MIB and _alloc.stats()["live"] == 1


def test_a_freed_array_gives_its_block_back(arenas):
    _, worker = arenas
    arr = hooked(worker, lambda: np.arange(MIB, dtype=np.float64))
    assert worker.usage()["live_blocks"] == 1
    del arr
    assert worker.usage()["live_blocks"] == 0 and _alloc.stats()["live"] == 0


def test_the_next_array_reuses_the_freed_block(arenas):
    _, worker = arenas

    def twice():
        first = np.empty(4 * MIB // 8)
        where = _ndarray.address_of(first)
        del first
        return where, np.empty(4 * MIB // 8)

    where, second = hooked(worker, twice)
    assert _ndarray.address_of(second) == where  # pages the first one faulted in: warm


def test_a_view_keeps_the_block_after_its_base_is_dropped(arenas):
    _, worker = arenas
    view = hooked(worker, lambda: np.arange(MIB, dtype=np.float64)[::2])
    assert view[3] == 6.0 and worker.usage()["live_blocks"] == 1
    del view
    assert worker.usage()["live_blocks"] == 0


def test_zeros_keep_mallocs_lazy_pages(arenas):
    _, worker = arenas
    zeros = hooked(worker, lambda: np.zeros(4 * MIB))
    assert not in_region(worker, zeros) and zeros.sum() == 0


def test_growing_an_array_in_place_keeps_its_values(arenas):
    _, worker = arenas

    def grow():
        arr = np.arange(MIB // 8, dtype=np.float64)
        arr.resize(4 * MIB // 8, refcheck=False)  # NumPy's realloc: into a larger block
        return arr

    arr = hooked(worker, grow)
    assert in_region(worker, arr)
    assert np.array_equal(arr[: MIB // 8], np.arange(MIB // 8)) and not arr[MIB // 8 :].any()
    del arr
    assert worker.usage()["live_blocks"] == 0


def test_a_full_arena_falls_back_to_malloc(arenas):
    _, worker = arenas
    before = _alloc.stats()["fallbacks"]
    arr = hooked(worker, lambda: np.ones(MIB), cap_bytes=MIB)  # the hook may commit 1 MiB at most
    assert not in_region(worker, arr) and arr.sum() == MIB
    assert _alloc.stats()["fallbacks"] == before + 1


def test_an_array_larger_than_the_budget_still_allocates(arenas):
    _, worker = arenas
    arr = hooked(worker, lambda: np.ones(16 * MIB))  # 128 MiB in a 64 MiB arena
    assert not in_region(worker, arr) and arr[-1] == 1.0


def test_the_hook_stays_in_its_context(arenas):
    _, worker = arenas
    seen = {}

    def inside():
        t = threading.Thread(target=lambda: seen.setdefault("thread", np.ones(MIB)))
        t.start()
        t.join()
        return np.ones(MIB)

    here = hooked(worker, inside)
    outside = np.ones(MIB)
    assert in_region(worker, here)
    assert not in_region(worker, seen["thread"])  # a new thread starts with NumPy's default
    assert not in_region(worker, outside)


def test_the_parent_never_installs_it(arenas):
    parent, _ = arenas
    with pytest.raises(ValueError, match="parent"):
        _alloc.install(parent)


def test_adopt_gives_a_block_on_the_arrays_own_bytes(arenas):
    _, worker = arenas
    arr = hooked(worker, lambda: np.full(MIB, 7.0))
    blk = _alloc.adopt(arr)
    assert blk.address == _ndarray.address_of(arr) and worker.count(1, blk.off) == 2
    assert _alloc.adopt(np.ones(MIB)) is None  # malloc's: copied when sent
    del arr
    assert worker.count(1, blk.off) == 1  # the Block's reference alone
    del blk
    assert worker.usage()["live_blocks"] == 0


def test_a_forked_child_uses_malloc_and_leaves_the_workers_blocks_alone(arenas):
    _, worker = arenas
    r, w = os.pipe()

    def fork_inside():
        arr = np.ones(MIB)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                ok = not in_region(
                    worker, np.ones(2 * MIB)
                )  # the handler is inherited, the region is not
                del (
                    arr
                )  # frees the child's copy of a hook array: must not drop the worker's reference
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        return arr

    arr = hooked(worker, fork_inside)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    assert got == b"1"
    off = _ndarray.address_of(arr) - worker.base_address - worker.header_bytes
    assert worker.count(1, off) == 1 and arr.sum() == MIB
    del arr
    assert worker.usage()["live_blocks"] == 0


FRESH_QUERIES = """
import numpy as np
from fastpool._native import _alloc, _arena
arena = _arena.Arena.create(1, 1 << 24)
arr = np.ones(1 << 18)
print(_alloc.adopt(arr, arena), _alloc.is_hook_array(arr, arena), _alloc.rebase(arr))
arena.close()
"""


def test_queries_before_any_hook_answer_no_without_touching_numpys_c_api():
    # _alloc imports NumPy's C API with its first hook; a process that loaded the
    # module and never made one still sends plain arrays through adopt().
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FRESH_QUERIES],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "None False False"), done.stderr
