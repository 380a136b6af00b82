"""Arena.trim in one process: the pages of freed blocks beyond the warm reserve go back
to the kernel, a block in use is never touched, and a trimmed block that is reused
holds what is written to it (issue 24, wanted 3; docs/arrays.md, "Memory that comes
back").  What the arena holds is read from the kernel (the memfd's blocks), not from
the arena's own counters."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fastpool._native import _arena, _ndarray

MIB = 1 << 20


@pytest.fixture
def arena():
    a = _arena.Arena.create(1, 256 * MIB)
    yield a
    a.close()


def held(arena) -> int:
    return os.fstat(arena.fileno()).st_blocks * 512


def filled(arena, value: float) -> np.ndarray:
    arr = _ndarray.new_array(arena, 2 * MIB, np.float64)  # 16 MiB
    arr[:] = value
    return arr


def test_a_trim_gives_back_freed_blocks_and_never_a_block_in_use(arena):
    arrs = [filled(arena, float(i)) for i in range(6)]
    before = held(arena)
    del arrs[1], arrs[2], arrs[3]  # frees the blocks of 1, 3 and 5; 0, 2 and 4 stay live
    kept = {0: arrs[0], 2: arrs[1], 4: arrs[2]}
    given, live = arena.trim(reserve=0)
    assert live == 3
    assert given >= 3 * 15 * MIB
    assert held(arena) <= before - given + MIB
    for value, arr in kept.items():
        assert (arr == value).all(), f"a live block lost its data: {value}"
    mem = arena.memory()
    assert mem["returned_bytes"] == given and mem["held_bytes"] == held(arena)


def test_the_reserve_stays_warm_and_a_second_trim_gives_nothing_more(arena):
    arrs = [filled(arena, float(i)) for i in range(4)]
    del arrs
    given, live = arena.trim(reserve=20 * MIB)
    assert live == 0
    # the first freed block (16 MiB and its header page) fits the reserve: it stays
    assert 2 * 15 * MIB <= given <= 3 * 16 * MIB
    assert arena.trim(reserve=20 * MIB) == (0, 0)


def test_a_trimmed_block_that_is_reused_holds_what_is_written(arena):
    arrs = [filled(arena, float(i)) for i in range(4)]
    del arrs
    assert arena.trim(reserve=0)[0] > 0
    again = [filled(arena, 10.0 + i) for i in range(4)]  # the same blocks, taken again
    for i, arr in enumerate(again):
        assert (arr == 10.0 + i).all()
    assert arena.trim(reserve=0) == (0, 4)  # all live: nothing to give back
