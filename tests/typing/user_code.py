"""Typical user code: a NumPy batch script on fastpool, checked with ``mypy --strict``.

Every ``assert_type`` pins what a type checker must infer; test_typing.py runs
mypy on this file (no error allowed) and also runs it as a script.  It uses the
public API only, the way a user writes it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future, as_completed
from typing import Any, assert_type

import numpy as np
from numpy.typing import NDArray

import fastpool


def column_means(block: NDArray[np.float64], scale: float = 1.0) -> NDArray[np.float64]:
    return np.asarray(block.mean(axis=0) * scale, dtype=np.float64)


def square(x: int) -> int:
    return x * x


def weighted(x: int, w: float) -> float:
    return x * w


def fill_rows(out: NDArray[np.float32], start: int, stop: int) -> int:
    out[start:stop] = np.arange(start, stop, dtype=np.float32)[:, None]
    return stop - start


@fastpool.task(pure=True, timeout=60)
def checksum(data: NDArray[np.float64]) -> float:
    return float(data.sum())


@fastpool.task
def label(i: int, prefix: str = "item") -> str:
    return f"{prefix}-{i}"


def on_progress(done: int, total: int | None) -> None:
    pass


async def serve(pool: fastpool.Pool, data: NDArray[np.float64]) -> float:
    one = await pool.asubmit(checksum, data)
    assert_type(one, float)
    tagged = await pool.asubmit(label, 3, prefix="row")
    assert_type(tagged, str)
    squares = [s async for s in pool.amap(square, range(10))]
    assert_type(squares, list[int])
    async with pool.amap(weighted, range(5), [0.5] * 5, ordered=False) as results:
        async for w in results:
            assert_type(w, float)
    forced = await pool.options(force_cancel=True).asubmit(square, 4)
    return one + forced


def main() -> None:
    rng = np.random.default_rng(0)
    with fastpool.Pool("auto", max_queue=1024, on_full="block", task_timeout=300) as pool:
        data = pool.share(rng.random((1000, 8)), readonly=True)
        assert_type(data, NDArray[np.float64])

        fut = pool.submit(column_means, data, scale=2.0)
        assert_type(fut, Future[NDArray[np.float64]])
        means = fut.result()
        print(means.shape)

        out = pool.zeros((100, 4), dtype=np.float32)
        assert_type(out, NDArray[np.float32])
        rows = [pool.submit(fill_rows, out, i, i + 10) for i in range(0, 100, 10)]
        assert sum(f.result() for f in as_completed(rows)) == 100

        scratch = pool.empty(16)
        assert_type(scratch, NDArray[np.float64])
        loose = pool.empty((4, 4), dtype="f4")
        assert_type(loose, NDArray[Any])

        with pool.arrays() as born:
            frames = rng.random((8, 256, 256))  # made in the pool's shared memory
        assert born.stats()["served"] >= 1
        assert_type(pool.submit(column_means, frames[0]).result(), NDArray[np.float64])

        squares = list(pool.map(square, range(100), chunksize=10, progress=on_progress))
        assert_type(squares, list[int])
        total = sum(pool.map(weighted, range(10), [0.5] * 10), 0.0)
        assert_type(total, float)
        unordered = sorted(pool.imap_unordered(square, range(20), progress=False))
        assert_type(unordered, list[int])

        careful = pool.options(pure=True, timeout=30.0, fallback="inline")
        assert_type(careful.submit(checksum, data).result(), float)
        assert_type(pool.submit(label, 1).result(), str)

        futures = [pool.submit(square, i) for i in range(8)]
        for f in fastpool.progress(futures, kind=on_progress):
            assert_type(f, Future[int])
            f.result()

        per_worker = pool.run_on_workers(square, 3, timeout=30.0)
        assert_type(per_worker, dict[int, int])
        assert set(per_worker.values()) == {9}
        either = pool.run_on_workers(weighted, 2, w=0.5, on_error="return")
        assert_type(either, dict[int, float | BaseException])

        print(asyncio.run(serve(pool, data)))
        pool.cancel(fut)
        stats: dict[str, Any] = pool.stats()
        print(stats["calls_completed"])


if __name__ == "__main__":
    main()
