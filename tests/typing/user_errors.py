"""Deliberate mistakes a type checker must report on fastpool code.

Each line that must be flagged ends with ``# E: <mypy error code>``;
test_typing.py checks that mypy --strict reports exactly that code on exactly
those lines (and nothing else).  Never run: it is wrong on purpose.
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
from numpy.typing import NDArray

import fastpool


def square(x: int) -> int:
    return x * x


def scale(block: NDArray[np.float64], factor: float) -> NDArray[np.float64]:
    return block * factor


def count_only(done: int) -> None:
    pass


@fastpool.task(timeout=5)
def label(i: int) -> str:
    return str(i)


async def misuse_async(pool: fastpool.Pool) -> None:
    await pool.asubmit(square, "3")  # E: arg-type
    text: str = await pool.asubmit(square, 3)  # E: arg-type
    async for r in pool.amap(square, ["a", "b"]):  # E: arg-type
        print(r)
    async for s in pool.amap(square, range(3)):
        s.upper()  # E: attr-defined


def misuse(pool: fastpool.Pool, data: NDArray[np.float64]) -> None:
    pool.submit(square, "3")  # E: arg-type
    pool.submit(square, 1, 2)  # E: call-arg
    pool.submit(scale, data, factor="2")  # E: arg-type
    wrong: Future[str] = pool.submit(square, 3)  # E: arg-type
    pool.map(square, ["a", "b"])  # E: arg-type
    names: list[str] = list(pool.map(square, range(3)))  # E: arg-type
    pool.imap_unordered(square, [1.5])  # E: arg-type
    pool.map(square, range(3), progress="bar")  # E: call-overload
    pool.map(square, range(3), progress=count_only)  # E: arg-type
    pool.imap_unordered(square, range(3), progress=count_only)  # E: arg-type
    # Inferred without a declared target (with one, mypy falls back to the
    # NDArray[Any] overload, as it does for numpy.empty itself)
    doubles = pool.empty(3, dtype=np.float64)
    as_int: NDArray[np.int32] = doubles  # E: assignment
    zeros = pool.zeros(3)
    i64: NDArray[np.int64] = zeros  # E: assignment
    shared = pool.share(data)
    ints: NDArray[np.int64] = shared  # E: assignment
    label("1")  # E: arg-type
    pool.submit(label, "1")  # E: arg-type
    n: int = pool.submit(label, 1).result()  # E: assignment
    pool.options(fallback="thread")  # E: arg-type
    for f in fastpool.progress([pool.submit(square, 1)]):
        f.result().upper()  # E: attr-defined


fastpool.Pool(workers="all")  # E: arg-type
fastpool.Pool(on_full="drop")  # E: arg-type
