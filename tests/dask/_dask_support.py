"""Helpers the Dask tests share (conftest.py is not importable by name: tests/ has one too)."""

from __future__ import annotations

from typing import Any

import psutil

TAG_VAR = "FASTPOOL_DASK_TEST_TAG"
LEAK_GRACE_S = 10.0


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries tag (zombies have exited)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG_VAR) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"pid {p.pid} ({' '.join(p.cmdline())[:70]!r}, parent {p.ppid()})")
        except psutil.Error:
            out.append(f"pid {p.pid}")
    return ", ".join(out)


def worker_addresses(client: Any) -> list[str]:
    return sorted(client.scheduler_info()["workers"])
