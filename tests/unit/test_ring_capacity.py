"""A ring's room does not depend on where it last emptied (found while testing issue 9).

``fp_ringv_reserve`` (csrc/fp_ring.h) restarts an empty ring at offset 0 "where the
pages are warm" when the next record fits below the old position X.  The bytes
from X to the end are then skipped, and they count as used until the reader
passes them, which it only does by reading the record at 0.  So until the reader
catches up, the ring holds X bytes, not its capacity: after one small round trip
X is one record, and the ring holds one record.  Both directions use the same
code: a worker whose parent is slow to read blocks after one result, and a
parent pushing a burst of tasks gets "ring full" after one or two.
"""

from __future__ import annotations

import os

import pytest

from fastpool._native._core import Board
from fastpool._runtime import _codec

RECORD = b"x" * 40  # a 64-byte record with its header


@pytest.fixture
def ends():
    """(producer view, consumer view) of slot 0's task ring, as parent and worker see it."""
    parent = Board.create(1, 1 << 20)
    fd = os.dup(parent.fileno())
    try:
        worker = Board.attach(fd)
    finally:
        os.close(fd)
    yield parent, worker
    worker.close()
    parent.close()


def _fill(parent: Board, limit: int) -> int:
    n = 0
    while n < limit and parent.push_control(0, _codec.K_STOP, RECORD):
        n += 1
    return n


def test_a_fresh_ring_holds_many_records(ends):
    parent, _worker = ends
    assert _fill(parent, 100) == 100


def test_a_ring_that_emptied_at_a_small_offset_still_holds_many_records(ends):
    parent, worker = ends
    assert parent.push_control(0, _codec.K_STOP, RECORD)
    assert worker.pop_task(0, 5.0) is not None  # empty again, at offset 64
    assert _fill(parent, 100) == 100  # today: 1
