"""Type stubs for fastpool/_runtime/_slots.pyx (compiled): the worker slots as the
dispatcher sees them.  Only the dispatcher uses Slots, through cdef methods."""

from typing_extensions import disjoint_base  # a C layout: no class can derive from two of these

from fastpool._native._core import Board

@disjoint_base
class Slots:
    def __new__(cls, board: Board, nslots: int, max_tasks: int | None) -> Slots: ...
