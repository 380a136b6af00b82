"""The peers and helpers of ``python -m fastpool bench`` (fastpool/_bench/peers.py), as
pytest-benchmark fixtures need them: a peer that cannot run here is skipped, not failed.

Test modules import from here (importing conftest.py from a test module is not
reliable); the adapters themselves live in the package, so the command and this
suite time the same calls.
"""

from __future__ import annotations

import pytest

from fastpool._bench import peers as _shared
from fastpool._bench.memory import MemorySampler, peak_memory  # noqa: F401  (re-exported)
from fastpool._bench.peers import (  # noqa: F401  (re-exported for the test modules)
    ABANDONED,
    DEFAULT_WORKERS,
    Peer,
    PeerUnavailable,
    close_peer,
    fresh_process_first_result_s,
    reap,
    spawn_reference_s,
    worker_processes,
)


def _skipping(cls: type[Peer]) -> type[Peer]:
    """``cls`` whose require() skips the test instead of raising PeerUnavailable."""

    def require() -> None:
        try:
            cls.require()
        except PeerUnavailable as exc:
            pytest.skip(f"{cls.name}: {exc}")

    return type(cls.__name__, (cls,), {"require": staticmethod(require)})


PEERS: dict[str, type[Peer]] = {name: _skipping(cls) for name, cls in _shared.ALL_PEERS.items()}
TASK_PEERS = list(_shared.TASK_PEERS)
ARRAY_PEERS = list(_shared.ARRAY_PEERS)


def open_peer(name: str, workers: int = DEFAULT_WORKERS, warm: bool = True):
    """A constructed (and warmed) peer, always shut down; skips when it cannot run here."""
    return _shared.open_peer(name, workers, warm, peers=PEERS)


def median_s(benchmark) -> float | None:
    """The median pytest-benchmark measured, or None under --benchmark-disable."""
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else stats.stats.median


def tag(benchmark, peer_name: str, variant: str = "", *, idiom: str = "", **extra) -> None:
    """Labels report.py groups rows by; every test calls this.

    ``variant`` names a swept setting (``chunksize=5000``: the report keeps a peer's
    best); ``idiom`` a different way of using fastpool (``share``: its own row)."""
    benchmark.extra_info["peer"] = peer_name
    benchmark.extra_info["variant"] = variant or idiom
    benchmark.extra_info["idiom"] = idiom
    benchmark.extra_info.update(extra)
