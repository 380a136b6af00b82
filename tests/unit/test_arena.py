"""Claims about fastpool._native._arena in one process: sizes a user can pass, and an
arena whose headers were overwritten (as a worker's task can) through ctypes.

Every worker maps the whole arena read-write; these tests write the garbage
from this process, where a real one comes from a worker (tests/faults/
test_arena_scribbles.py does that with a second process)."""

from __future__ import annotations

import ctypes
import errno
import os
import pickle

import numpy as np
import pytest

from fastpool import errors
from fastpool._native import _arena, _ndarray

MIB = 1 << 20
PAGE = 4096
TOP_AT = 128  # fp_arena_t is 128 bytes; fp_a64 top[nprocs] follows
SIZE_AT = 8  # fp_block_t: magic, size, gen, owner, counts at 32
COUNT_AT = 32

ADVERSARIAL = [0, 1, PAGE - 1, PAGE + 8, 2**64 - 1, 2**64 - PAGE, 2**63, 1 << 40]


@pytest.fixture
def arena():
    a = _arena.Arena.create(3, 8 * MIB)
    yield a
    a.close()


def poke64(arena, off: int, value: int) -> None:
    ctypes.c_uint64.from_address(arena.base_address + off).value = value % 2**64


def peek64(arena, off: int) -> int:
    return ctypes.c_uint64.from_address(arena.base_address + off).value


def poke32(arena, off: int, value: int) -> None:
    ctypes.c_uint32.from_address(arena.base_address + off).value = value


def region_base(arena, r: int) -> int:
    return arena.regions_offset + r * arena.region_bytes


def filled(arena, n: int, value: float) -> np.ndarray:
    arr = _ndarray.new_array(arena, n, np.float64)
    arr[:] = value
    return arr


# ---- sizes ----------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, -1, MIB - 1, -(2**70)])
def test_a_budget_under_a_mib_is_a_value_error(budget):
    with pytest.raises(ValueError, match="at least 1 MiB"):
        _arena.Arena.create(2, budget)


@pytest.mark.parametrize("budget", [2**46, 2**64 - 1, 2**64 + 4096, 2**200])
def test_a_budget_past_the_address_space_is_a_value_error_not_a_wrap(budget):
    with pytest.raises(ValueError, match="too large for 4 workers.*at most"):
        _arena.Arena.create(4, budget)


def test_the_largest_budget_the_error_names_is_accepted():
    with pytest.raises(ValueError) as info:
        _arena.geometry(1, 2**46)
    cap = int(str(info.value).split("pass at most ")[1].split(" ")[0])
    nprocs, region, total = _arena.geometry(1, cap)
    assert (nprocs, region) == (2, cap) and 0 < total <= 2**46
    with pytest.raises(ValueError):
        _arena.geometry(1, cap + 1)


@pytest.mark.parametrize("workers", [0, -1, 1024, 2**40])
def test_a_worker_count_the_layout_cannot_hold_is_a_value_error(workers):
    with pytest.raises(ValueError, match="serves 1 to 1023 workers"):
        _arena.Arena.create(workers, 8 * MIB)


@pytest.mark.parametrize("budget", [8.0 * MIB, "8M", None])
def test_a_budget_that_is_not_an_int_is_a_type_error(budget):
    with pytest.raises(TypeError, match="must be integers"):
        _arena.Arena.create(2, budget)


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**62,), (2**31, 2**31, 4)])
def test_an_array_whose_byte_size_overflows_is_a_value_error(arena, shape):
    with pytest.raises(ValueError, match="more than a process can address"):
        _ndarray.new_array(arena, shape, np.float64)


def test_an_array_larger_than_the_budget_is_a_shared_memory_error(arena):
    with pytest.raises(errors.SharedMemoryError, match="arena_bytes"):
        _ndarray.new_array(arena, (MIB, 16), np.float64)  # 128 MiB in an 8 MiB arena
    assert _ndarray.new_array(arena, 1000, np.float64).shape == (1000,)  # nothing was spent


def test_the_memfd_cannot_be_shrunk_or_grown_by_anyone_holding_its_fd(arena):
    # A worker holds the fd; shrinking it would make the parent's next touch SIGBUS.
    for size in (0, PAGE, arena.region_bytes * 8):
        with pytest.raises(OSError) as info:
            os.ftruncate(arena.fileno(), size)
        assert info.value.errno == errno.EPERM


def test_attach_checks_the_header_copy_against_the_file_s_real_size(arena):
    head = os.pread(arena.fileno(), PAGE, 0)
    for size, why in ((100, "too short"), (2 * PAGE, "magic or layout")):
        fd = os.memfd_create("fake-arena")
        try:
            os.write(
                fd, head[:size]
            )  # the real header, in a file too short for the arena it describes
            with pytest.raises(errors.SegmentCorrupt, match=why):
                _arena.Arena.attach(fd, 1)
        finally:
            os.close(fd)
    with pytest.raises(errors.SegmentCorrupt, match="outside the arena"):
        _arena.Arena.attach(arena.fileno(), 4)


# ---- damage ---------------------------------------------------------------------------


def test_region_corrupt_pickles_with_its_facts():
    exc = errors.RegionCorrupt(2, "a block that runs past the region's top (read 5)", 8192)
    back = pickle.loads(pickle.dumps(exc))
    assert isinstance(back, errors.SegmentCorrupt)
    assert (back.region, back.slot, back.offset, back.detail) == (2, 1, 8192, exc.detail)
    assert "region 2 (worker slot 1) is corrupt at +8192" in str(back)


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_a_garbage_block_size_is_reported_by_every_walk_naming_its_region(arena, value):
    held = filled(arena, 1000, 7.0)
    worker = _arena.Arena.attach(arena.fileno(), 2)  # worker slot 1, region 2
    mine = [worker.alloc(5000) for _ in range(3)]
    assert arena.ref(mine[2].off, mine[2].gen, False).nbytes >= 5000
    poke64(arena, mine[1].off + SIZE_AT, value)
    base = region_base(arena, 2)
    for call in (arena.usage, lambda: arena.reclaim(1), lambda: arena.check_region(2)):
        with pytest.raises(errors.RegionCorrupt) as info:
            call()
        assert (info.value.region, info.value.slot, info.value.offset) == (2, 1, mine[1].off - base)
    with pytest.raises(errors.RegionCorrupt):
        worker.alloc(3 * PAGE)  # the region's owner: asks for more than its free blocks hold
    assert set(arena.corrupt_regions()) == {2}
    assert arena.check_region(0) == 1 and arena.check_region(1) == 0 and arena.check_region(3) == 0
    assert (held == 7.0).all()
    assert (filled(arena, 1000, 3.0) == 3.0).all()  # the parent's own region still allocates
    del mine
    worker.close()


@pytest.mark.parametrize("value", ADVERSARIAL + [-PAGE])
def test_a_garbage_top_is_reported_and_the_parent_keeps_its_arrays(arena, value):
    held = filled(arena, 10_000, 5.0)
    poke64(arena, TOP_AT + 8 * 0, value)  # the parent's own region
    with pytest.raises(errors.RegionCorrupt) as info:
        arena.alloc(10)
    assert info.value.region == 0
    if value % 2**64 % PAGE == 0 and value % 2**64 <= arena.region_bytes:
        # a plausible top (0: an empty region): only the owner's own record tells
        assert arena.usage()["live_blocks"] == 0 and arena.reclaim(0) == 0
    else:
        with pytest.raises(errors.RegionCorrupt):
            arena.usage()
        with pytest.raises(errors.RegionCorrupt):
            arena.reclaim(0)  # region 0 cannot be walked; the others are reclaimed all the same
    assert (held == 5.0).all()
    arena.close()  # never raises for damage


def test_a_top_lowered_to_a_block_boundary_is_caught_by_the_owner_s_own_record(arena):
    a, b = filled(arena, 1000, 1.0), filled(arena, 1000, 2.0)
    blk_b = _arena_block(b)
    poke64(
        arena, TOP_AT, blk_b.off - region_base(arena, 0)
    )  # b falls off the chain: consistent, but wrong
    assert arena.check_region(0) == 1
    with pytest.raises(errors.RegionCorrupt, match="top"):
        arena.alloc(1000)  # a bump now would land on b
    assert (a == 1.0).all() and (b == 2.0).all()


def _arena_block(arr):
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, _arena.Block)
    return base


def test_a_block_keeps_its_length_when_its_header_is_enlarged(arena):
    arr = filled(arena, 1000, 4.0)
    blk = _arena_block(arr)
    nbytes = blk.nbytes
    poke64(
        arena, blk.off + SIZE_AT, arena.region_bytes * 2
    )  # past the region and the mapping's end
    assert blk.nbytes == nbytes and memoryview(blk).nbytes == nbytes
    with pytest.raises(errors.SegmentCorrupt, match="past the region's top"):
        arena.ref(blk.off, blk.gen, False)  # a new view would span foreign memory: refused
    assert arena.count(0, blk.off) == 1  # the refusal took no reference
    assert (arr == 4.0).all()


@pytest.mark.parametrize("off", [0, 64, 2**63, 2**64 - PAGE])
def test_descriptor_offsets_that_are_no_block_are_refused_before_any_access(arena, off):
    with pytest.raises(errors.SegmentCorrupt, match="not a block header"):
        arena.ref(off, 1, False)
    with pytest.raises(ValueError):
        arena.count(0, off)
    arena.unref_for(1, off)  # ignored, never a stray write


def test_zeroed_counts_under_a_held_block_are_refused_not_handed_out_twice(arena):
    arr = filled(arena, 1000, 9.0)
    blk = _arena_block(arr)
    poke32(arena, blk.off + COUNT_AT, 0)  # a worker zeroes the parent's count: the block looks free
    with pytest.raises(errors.RegionCorrupt, match="covers one this process still holds"):
        arena.alloc(1000)
    assert (arr == 9.0).all()


def test_a_free_block_forged_to_cover_a_held_one_is_refused(arena):
    first, held, last = filled(arena, 1000, 1.0), filled(arena, 1000, 2.0), filled(arena, 1000, 3.0)
    a_off, b_off = _arena_block(first).off, _arena_block(held).off
    del first  # free
    size_a, size_b = peek64(arena, a_off + SIZE_AT), peek64(arena, b_off + SIZE_AT)
    poke64(
        arena, a_off + SIZE_AT, size_a + size_b
    )  # a plausible chain: first, now over held, then last
    assert arena.check_region(0) == 2
    with pytest.raises(errors.RegionCorrupt, match="covers one this process still holds"):
        arena.alloc(size_a + size_b - arena.header_bytes)
    assert (held == 2.0).all() and (last == 3.0).all()


def test_reset_region_quarantines_the_damage_and_keeps_blocks_others_map(arena):
    worker = _arena.Arena.attach(arena.fileno(), 1)  # worker slot 0
    results = [worker.alloc(20_000) for _ in range(3)]
    views = []
    for i, b in enumerate(results):
        v = np.frombuffer(arena.ref(b.off, b.gen, False), np.uint8)
        v[:20_000] = 10 + i
        views.append(v)  # the parent holds the worker's results
    offs = [b.off for b in results]
    assert arena.reclaim(0) == 3  # the worker "died" holding its three blocks
    poke64(arena, offs[1] + SIZE_AT, 2**64 - PAGE)
    assert set(arena.corrupt_regions()) == {1}
    quarantined = arena.reset_region(1)
    assert quarantined >= 2 * 20_000
    assert arena.corrupt_regions() == {}
    for i, v in enumerate(views):
        assert (v[:20_000] == 10 + i).all()
    again = _arena.Arena.attach(arena.fileno(), 1)  # the replacement in slot 0
    fresh = [again.alloc(20_000) for _ in range(20)]
    for b in fresh:
        assert not offs[1] <= b.off < offs[1] + quarantined, "allocated inside the quarantine"
        np.frombuffer(b, np.uint8)[:] = 0xEE
    for i, v in enumerate(views):
        assert (v[:20_000] == 10 + i).all()
    del fresh, results, b
    again.close()
    worker.close()


def test_reset_region_of_a_whole_chain_changes_nothing(arena):
    held = filled(arena, 1000, 1.0)
    assert arena.reset_region(2) == 0 and arena.reset_region(0) == 0
    assert arena.check_region(0) == 1 and (held == 1.0).all()
    with pytest.raises(ValueError, match="regions 0 to 3"):
        arena.reset_region(4)


def test_a_worker_may_not_reset_another_process_s_region(arena):
    worker = _arena.Arena.attach(arena.fileno(), 1)
    with pytest.raises(ValueError, match="only the parent"):
        worker.reset_region(2)
    worker.close()


# ---- zeros and page-matched copies ---------------------------------------------------


def test_zeros_on_a_fresh_block_skip_the_memset_and_on_a_reused_one_clear_old_bytes(arena):
    first = _ndarray.new_array(arena, MIB // 8, np.float64, zero=True)
    assert first.base.fresh and not first.any()
    first[:] = 7.0
    del first
    again = _ndarray.new_array(arena, MIB // 8, np.float64, zero=True)
    assert not again.base.fresh and not again.any()  # the same block, its 7.0s cleared


def test_a_large_copy_starts_at_the_sources_offset_in_its_page(arena):
    src = np.arange(MIB // 8 + 3, dtype=np.float64)[3:]  # 24 bytes into a malloc'd buffer
    out = _ndarray.copy_in(arena, src)
    assert _ndarray.address_of(out) % PAGE == _ndarray.address_of(src) % PAGE
    assert np.array_equal(out, src) and out.base.nbytes >= out.nbytes
    small = _ndarray.copy_in(arena, np.ones(1000))
    assert _ndarray.address_of(small) == small.base.address  # small copies: no padding


def test_a_dead_workers_free_blocks_give_their_pages_back(arena):
    worker = _arena.Arena.attach(arena.fileno(), 1)
    try:
        mine = _ndarray.new_array(worker, MIB // 8, np.float64)
        mine[:] = 5.0
        kept = _ndarray.new_array(worker, MIB // 8, np.float64)
        kept[:] = 6.0
        seen = np.frombuffer(
            arena.ref(kept.base.off, kept.base.gen, False), np.float64, kept.size
        )  # the parent's
        arena.reclaim(0)  # worker slot 0 died holding both
        assert not mine[PAGE // 8 :].any()  # free: its pages past the header's were punched
        assert (seen == 6.0).all()  # referenced by the parent: untouched
    finally:
        worker.close()
