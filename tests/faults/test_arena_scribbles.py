"""A process that writes into the arena, as every worker can, never hangs or crashes
the parent; the board's own damage is tests/faults/test_board_scribbles.py.

The arena is a different room from the board, with different defences: the parent
walks each region's block headers, reports a damaged region (SegmentCorrupt,
RegionCorrupt) and resets it, and maps a read-only array read-only in the process
that receives it.  The scribbler is a real process: a fresh interpreter that
attaches the arena by the fd it inherits, as a worker does, allocates "results" in
its own region, then overwrites header words of every region through ctypes with
values a stray write produces (zero, one, huge, wrapping, random odd) and exits;
the parent then runs every arena call it has.  At pool level, a task that damages
its own region costs that worker, and the pool goes on.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import _faulty
import _tasks
import numpy as np
import pytest
from conftest import make_pool

from fastpool import errors
from fastpool._native import _arena, _ndarray

MIB = 1 << 20
PAGE = 4096
CHILD_TIMEOUT_S = 60
ROUNDS = 10  # one child process each
RESULT_S = 60

# Runs in the child: argv = fd, proc, seed, a JSON list of the parent's block offsets.
SCRIBBLER = r"""
import ctypes, json, random, sys
from fastpool._native import _arena

fd, proc, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
parent_blocks = json.loads(sys.argv[4])
a = _arena.Arena.attach(fd, proc)
rng = random.Random(seed)
mine = [a.alloc(rng.randrange(1, 40_000)) for _ in range(6)]
for b in mine[:3]:
    a.handoff(b)  # results handed to the parent, as _codec does
print(json.dumps([[b.off, b.gen] for b in mine[:3]]), flush=True)

P = 2**64
def garbage(here):
    return rng.choice([0, 1, 4095, 4104, P - 1, P - 4096, 2**63, 1 << 40, (P - here) % P,
                       (P - here + 4096) % P, rng.getrandbits(64) | 1])

def put64(off, v):
    ctypes.c_uint64.from_address(a.base_address + off).value = v % P

def put32(off, v):
    ctypes.c_uint32.from_address(a.base_address + off).value = v % 2**32

headers = [b.off for b in mine] + parent_blocks
for _ in range(rng.randrange(1, 6)):
    what = rng.randrange(5)
    if what == 0:
        put64(128 + 8 * rng.randrange(a.nprocs), garbage(0))             # a region's top
    else:
        h = rng.choice(headers)
        if what == 1:
            put64(h + 8, garbage(h))                                     # a block's size
        elif what == 2:
            put64(h, garbage(h))                                         # its magic
        elif what == 3:
            put64(h + 16, garbage(h))                                    # its generation
        else:  # a count: garbage, not zero
            put32(h + 32 + 4 * rng.randrange(a.nprocs), garbage(h) | 1)
"""


def _scribble(
    arena: _arena.Arena, proc: int, seed: int, parent_blocks: list[int]
) -> list[list[int]]:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIBBLER,
            str(arena.fileno()),
            str(proc),
            str(seed),
            json.dumps(parent_blocks),
        ],
        pass_fds=(arena.fileno(),),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def _block(arr: np.ndarray) -> _arena.Block:
    b = arr.base
    while isinstance(b, np.ndarray):
        b = b.base
    return b


def _every_call(arena: _arena.Arena, results: list[list[int]]) -> int:
    """Runs every arena call the parent has; returns how many reported SegmentCorrupt.
    Anything else raised (or a crash, or a hang) fails the test."""
    corrupt = 0
    calls = [
        arena.usage,
        lambda: arena.reclaim(0),
        lambda: arena.reclaim(1),
        lambda: arena.alloc(50_000),
        lambda: arena.alloc(10),
    ]
    calls += [lambda r=r: arena.check_region(r) for r in range(arena.nprocs)]
    calls += [lambda off=off, gen=gen: arena.ref(off, gen, False) for off, gen in results]
    for call in calls:
        try:
            call()
        except errors.SegmentCorrupt:
            corrupt += 1
        except errors.SharedMemoryError as exc:
            assert "was reused" in str(exc)  # a scribbled generation: a stale descriptor
    return corrupt


@pytest.mark.faults
@pytest.mark.slow
def test_a_process_scribbling_arena_headers_never_hangs_or_crashes_the_parent():
    seed = random.randrange(2**32)
    corrupt_total = 0
    for round_ in range(ROUNDS):
        arena = _arena.Arena.create(3, 16 * MIB)
        held = [_ndarray.new_array(arena, n, np.float64) for n in (1000, 30_000, 5)]
        for i, arr in enumerate(held):
            arr[:] = i + 0.5
        parent_blocks = [_block(a).off for a in held]
        results = _scribble(arena, 1 + round_ % 3, seed + round_, parent_blocks)
        corrupt_total += _every_call(arena, results)
        damaged = arena.corrupt_regions()
        for region, exc in damaged.items():
            assert exc.region == region and str(exc).startswith(f"shared arena region {region} ")
            arena.reset_region(region)
        assert arena.corrupt_regions() == {}, (
            f"seed {seed + round_}: a reset region still walks broken"
        )
        for i, arr in enumerate(held):
            assert (arr == i + 0.5).all(), f"seed {seed + round_}: the parent's array {i} changed"
        arena.close()  # never raises for damage
        for i, arr in enumerate(held):
            assert (arr == i + 0.5).all()  # still mapped: the Blocks outlive close()
    assert corrupt_total > 0, f"seed {seed}: {ROUNDS} rounds of garbage and nothing was reported"


@pytest.mark.faults
def test_the_size_that_looped_reclaim_for_ever_is_reported_at_once():
    arena = _arena.Arena.create(2, 8 * MIB)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, sys\nfrom fastpool._native import _arena\n"
            "a = _arena.Arena.attach(int(sys.argv[1]), 1)\nb = a.alloc(100)\n"
            "ctypes.c_uint64.from_address(a.base_address + b.off + 8).value = 2**64 - 4096\n"
            "print(b.off)",
            str(arena.fileno()),
        ],
        pass_fds=(arena.fileno(),),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert child.returncode == 0, child.stderr
    with pytest.raises(
        errors.RegionCorrupt,
        match="region 1 .worker slot 0. is corrupt at \\+0: a block that "
        "runs past the region's top .read 18446744073709547520.",
    ) as info:
        arena.reclaim(0)
    assert info.value.slot == 0
    assert arena.reset_region(1) > 0 and arena.corrupt_regions() == {}
    arena.close()


# A child that maps a block by descriptor, readonly or not, and writes into it
# through a raw pointer, as a C extension that ignores NumPy's flag would.
WRITER = r"""
import ctypes, sys
from fastpool._native import _arena
from fastpool._runtime import _arrays
a = _arena.Arena.attach(int(sys.argv[1]), 1)
off, gen, ro = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "ro"
arr = _arrays.rebuild(*_arrays.Descriptor(a.token, off, gen, 0, "f8", (1000,), (8,), ro))
print("mapped", flush=True)
ctypes.memset(arr.ctypes.data, 0x7f, 8000)
print("wrote", flush=True)
"""


@pytest.mark.faults
@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_a_readonly_array_is_mapped_read_only_in_the_process_that_receives_it(mode):
    arena = _arena.Arena.create(2, 8 * MIB)
    arr = _ndarray.share(arena, np.full(1000, 3.0), readonly=mode == "ro")
    blk = _block(arr)
    child = subprocess.run(
        [sys.executable, "-c", WRITER, str(arena.fileno()), str(blk.off), str(blk.gen), mode],
        pass_fds=(arena.fileno(),),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert child.stdout.startswith("mapped"), child.stderr
    if mode == "ro":
        assert child.returncode == -11, (child.returncode, child.stderr)  # SIGSEGV in the writer
        assert (arr == 3.0).all()
    else:  # the control: the same write through a writable descriptor lands
        assert child.returncode == 0, child.stderr
        assert not (arr == 3.0).any()
    assert arena.reclaim(0) in (0, 1)  # the writer's reference, if it died holding it
    arena.close()


@pytest.mark.faults
def test_a_task_that_scribbles_the_arena_costs_its_worker_and_the_pool_goes_on():
    with make_pool(1, backoff_base_s=0.01) as p:
        held = p.share(np.arange(1000.0))
        with pytest.raises(errors.SegmentCorrupt, match="region 1"):
            p.submit(_faulty.scribble_arena_top).result(timeout=RESULT_S)
        out = p.submit(_tasks.double, np.ones(1 << 18)).result(
            timeout=RESULT_S
        )  # a result in the arena
        assert (out == 2.0).all()
        assert (held == np.arange(1000.0)).all()
        assert p._arena.corrupt_regions() == {}
