"""One pool, many threads: the public methods are thread-safe (docs/api.md, "Thread safety").

Threads submit, map, cancel, wait on each other's futures and read stats() at
once.  Every future settles; each has its right result, or is cancelled when a
cancel said True (or said False for a running task, whose result is then dropped);
the counters add up at the end.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import CancelledError

from _tasks import add, double, sleep_then

import fastpool

THREADS = 6
ROUNDS = 30


def _worker_thread(pool, seed, barrier, out, errors):
    rng = random.Random(seed)
    mine = []  # (future, expected, cancel said)
    try:
        barrier.wait(30)
        for r in range(ROUNDS):
            futs = [(pool.submit(add, seed, i), seed + i) for i in range(8)]
            if r % 3 == 0:
                futs.append((pool.submit(sleep_then, r, 0.002), r))
            for f, expected in futs:
                said = None
                roll = rng.random()
                if roll < 0.15:
                    # force=False: a forced kill can land on the next task when the one it
                    # aimed at has just finished (a "collateral" death, WorkerCrashed),
                    # which this test would have to excuse; test_cancel covers force.
                    said = pool.cancel(f)
                elif roll < 0.25:
                    said = f.cancel()
                mine.append((f, expected, said))
            assert list(pool.map(double, range(r, r + 20), chunksize=rng.choice([1, 3, 7]))) == [
                2 * i for i in range(r, r + 20)
            ]
            got = sorted(pool.imap_unordered(double, range(10), chunksize=2))
            assert got == [2 * i for i in range(10)]
            pool.stats()
        out.extend(mine)
    except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
        errors.append(exc)


def _stats_reader(pool, stop, errors):
    try:
        while not stop.is_set():
            s = pool.stats()
            assert s["inflight"] >= 0 and s["queued"] >= 0
            assert len(s["workers"]) == pool.workers
            pool.pids()
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


def test_threads_submitting_mapping_cancelling_and_reading_stats_at_once():
    out: list = []
    errors: list = []
    with fastpool.Pool(2, backoff_base_s=0.01) as pool:
        barrier = threading.Barrier(THREADS)
        stop = threading.Event()
        reader = threading.Thread(target=_stats_reader, args=(pool, stop, errors))
        reader.start()
        threads = [
            threading.Thread(target=_worker_thread, args=(pool, s, barrier, out, errors))
            for s in range(THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stop.set()
        reader.join(30)
        assert not any(t.is_alive() for t in threads + [reader])
        assert errors == [], errors

        # Other threads wait on the same futures while this one does too.
        waiters = [
            threading.Thread(
                target=lambda: [
                    f.exception(timeout=60) if not f.cancelled() else None for f, _, _ in out
                ]
            )
            for _ in range(3)
        ]
        for w in waiters:
            w.start()
        cancelled = 0
        for f, expected, said in out:
            if said is True:
                try:
                    f.result(timeout=60)
                except CancelledError:
                    cancelled += 1
                    continue
                raise AssertionError(f"cancel said True but {f} has a result")
            if said is False and f.cancelled():
                # pool.cancel said False for a running task: the task ran on, and its
                # result was dropped when it returned (docs/api.md, Pool.cancel).
                cancelled += 1
                continue
            assert f.result(timeout=60) == expected, (f, said)
        for w in waiters:
            w.join(60)
        assert cancelled > 0  # the mix really cancelled something
        assert all(f.done() for f, _, _ in out)

        s = pool.stats()
        assert (s["inflight"], s["queued"]) == (0, 0)
        assert s["calls_submitted"] == len(out)
        assert (
            s["calls_submitted"] == s["calls_completed"] + s["calls_cancelled"] + s["calls_failed"]
        )
        assert s["calls_cancelled"] == cancelled
        assert (
            s["chunks_submitted"]
            == s["chunks_completed"] + s["chunks_cancelled"] + s["chunks_failed"]
        )
        assert s["chunks_cancelled"] == 0 and s["calls_failed"] == 0
