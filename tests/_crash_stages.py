"""The crash matrix's payloads (tests/faults/test_crash_matrix.py): objects that crash in
one way (``kind``) at one stage of a call's trip, and a runner for the cases that could take
the process that runs them down with them (run as ``python _crash_stages.py STAGE KIND``)."""

from __future__ import annotations

import ctypes
import os
import sys

KINDS = ("exception", "SystemExit", "c_exit", "segfault", "os_exit")


class Boom(Exception):
    """The exception of the "exception" kind."""


def fire(kind: str) -> None:
    if kind == "exception":
        raise Boom("boom")
    if kind == "SystemExit":
        raise SystemExit(3)
    if kind == "c_exit":
        ctypes.CDLL(None).exit(0)  # C exit(): atexit of the C library, no Python unwinding
    if kind == "segfault":
        ctypes.string_at(0)
    if kind == "os_exit":
        os._exit(0)
    raise ValueError(f"unknown kind {kind!r}")


def _fire_on_load(kind: str) -> None:
    fire(kind)


class OnPickle:
    """Crashes where it is pickled."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __reduce__(self):
        fire(self.kind)


class OnUnpickle:
    """Pickles fine; crashes where it is unpickled."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __reduce__(self):
        return _fire_on_load, (self.kind,)


def run(kind: str) -> None:
    fire(kind)


def make(cls_name: str, kind: str):
    return {"OnPickle": OnPickle, "OnUnpickle": OnUnpickle}[cls_name](kind)


def double(x: int) -> int:
    return 2 * x


def call_unpickle_case(kind: str) -> int:
    """A worker dies unpickling its call: the future fails, this process lives, the pool
    serves. Prints the outcome; exit status 0 when it is the documented one."""
    import fastpool
    from fastpool.errors import WorkerCrashed

    with fastpool.Pool(1) as pool:
        fut = pool.submit(len, OnUnpickle(kind))
        try:
            fut.result(timeout=60)
        except WorkerCrashed as exc:
            print("WorkerCrashed", exc)
        except BaseException as exc:  # noqa: BLE001 - reported, then judged by the test
            print("unexpected", type(exc).__name__, exc)
            return 1
        else:
            print("no error")
            return 1
        print("served", pool.submit(double, 21).result(timeout=60))
    return 0


if __name__ == "__main__":
    sys.exit(call_unpickle_case(sys.argv[1]))
