"""The "fastpool" joblib backend keeps joblib's contract: registration, pools reused per
configuration, options passed through, n_jobs counting, generators, sharedmem, BLAS
threads, auto-batching, nesting, and arrays that cross read-only through shared memory."""

from __future__ import annotations

import os
import warnings

import _joblib_tasks as T
import joblib
import numpy as np
import pytest
from _joblib_support import LEAK_GRACE_S, workers_alive
from _waiting import wait_for, wait_workers_ready
from joblib import Parallel, delayed, parallel_config

import fastpool
import fastpool.joblib
from fastpool.joblib import FastpoolBackend


def run(n_jobs: int = 2, **options):
    """A parallel_config for the backend (the tests' default pool: n_jobs=2, no options)."""
    return parallel_config(backend="fastpool", n_jobs=n_jobs, **options)


def test_import_registers_the_backend_and_register_is_idempotent():
    assert joblib.parallel.BACKENDS["fastpool"] is FastpoolBackend
    fastpool.joblib.register()
    fastpool.joblib.register()
    assert joblib.parallel.BACKENDS["fastpool"] is FastpoolBackend
    with run():
        assert Parallel()(delayed(T.square)(i) for i in range(5)) == [0, 1, 4, 9, 16]


def test_parallel_runs_in_the_pool_of_its_configuration_and_reuses_it():
    pool = fastpool.joblib.get_pool(2)
    with run():
        first = set(Parallel()(delayed(T.pid_of)(i) for i in range(8)))
        second = set(Parallel()(delayed(T.pid_of)(i) for i in range(8)))
    assert first <= set(pool.pids()) and second <= set(pool.pids())
    assert fastpool.joblib.get_pool(2) is pool
    assert os.getpid() not in first


def test_pool_options_pass_straight_through_and_make_their_own_pool():
    with run(memory_limit="3GB", task_timeout=120):
        pids = set(Parallel()(delayed(T.pid_of)(i) for i in range(4)))
    pool = fastpool.joblib.get_pool(2, memory_limit="3GB", task_timeout=120)
    assert pool is not fastpool.joblib.get_pool(2)
    assert pool.stats()["memory_limit_bytes"] == 3 * 10**9
    assert pids <= set(pool.pids())
    pool.shutdown()  # the next call with these options gets a new pool
    with run(memory_limit="3GB", task_timeout=120):
        assert Parallel()(delayed(T.square)(i) for i in range(3)) == [0, 1, 4]


def test_unknown_options_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match="unknown option 'bogus'.*memory_limit"):
        parallel_config(backend="fastpool", bogus=1)
    with pytest.raises(TypeError, match="n_jobs"):
        parallel_config(backend="fastpool", workers=3)
    with pytest.raises(ValueError, match="idle_worker_timeout"):
        parallel_config(backend="fastpool", idle_worker_timeout=-1)


def test_n_jobs_minus_one_counts_the_cpus_this_process_may_use(monkeypatch):
    backend = FastpoolBackend()
    assert backend.effective_n_jobs(-1) == fastpool.joblib.usable_cpus()  # fastpool's sizing
    monkeypatch.setattr(fastpool.joblib, "usable_cpus", lambda: 5)
    assert backend.effective_n_jobs(-1) == 5
    assert backend.effective_n_jobs(-2) == 4
    assert backend.effective_n_jobs(3) == 3
    with pytest.raises(ValueError):
        backend.effective_n_jobs(0)


def test_one_job_runs_sequentially_in_this_process():
    with run(n_jobs=1):
        assert Parallel()(delayed(T.pid_of)(i) for i in range(2)) == [os.getpid()] * 2


def test_return_as_generator_yields_in_order():
    with run():
        gen = Parallel(return_as="generator")(delayed(T.square)(i) for i in range(50))
        assert not isinstance(gen, list)
        assert list(gen) == [i * i for i in range(50)]


def test_return_as_generator_unordered_yields_as_tasks_finish(tmp_path):
    gate = tmp_path / "gate"
    # both tasks must run at once: wait for two ready workers (an earlier test may have
    # left a replacement starting), else both queue behind the first on one worker
    wait_workers_ready(fastpool.joblib.get_pool(2), 2)
    with run():
        # the first task waits for a gate this test opens only once the second task's
        # result came out: unordered, the second is yielded first
        gen = Parallel(return_as="generator_unordered", batch_size=1)(
            [delayed(T.wait_for_file)(str(gate), "first"), delayed(T.square)(7)]
        )
        assert next(gen) == 49
        gate.touch()
        assert list(gen) == ["first"]


def test_require_sharedmem_falls_back_to_threads():
    seen: list[int] = []

    def append_pid(i: int) -> None:  # only threads of this process can reach `seen`
        seen.append(os.getpid())

    with run():
        Parallel(require="sharedmem")(delayed(append_pid)(i) for i in range(4))
    assert seen == [os.getpid()] * 4


def test_inner_max_num_threads_sets_the_workers_blas_threads():
    with run(inner_max_num_threads=2):
        assert Parallel()(delayed(T.blas_threads)() for _ in range(2)) == [[2], [2]]
    with run(inner_max_num_threads=2, blas_threads=1), pytest.raises(ValueError, match="disagree"):
        Parallel()(delayed(T.square)(i) for i in range(2))


def test_tiny_tasks_are_batched():
    pool = fastpool.joblib.get_pool(2)
    before = pool.stats()["calls_submitted"]
    with run():
        assert Parallel()(delayed(T.square)(i) for i in range(3000)) == [i * i for i in range(3000)]
    assert (
        pool.stats()["calls_submitted"] - before < 300
    )  # joblib's own batching grows it; by 8 here


def test_lambdas_and_closures_are_sent_by_value():
    k = 3
    with run():
        assert Parallel()(delayed(lambda x: x + k)(i) for i in range(4)) == [3, 4, 5, 6]


def test_lambdas_anywhere_in_the_call_are_sent_by_value():
    import functools

    k = 10
    with run():
        add_k = functools.partial(lambda a, b: a + b, k)
        assert Parallel()(delayed(add_k)(i) for i in range(3)) == [10, 11, 12]
        assert Parallel()(delayed(T.apply)(lambda x: x * k, i) for i in range(3)) == [0, 10, 20]
        assert Parallel()(delayed(T.apply)(x=i, fn=lambda x: -x) for i in range(2)) == [0, -1]


def test_a_nested_parallel_inside_a_task_runs_in_a_pool_of_the_workers_own():
    with run():
        out = Parallel()(delayed(T.nested)(n) for n in (3, 4))
        outer = set(fastpool.joblib.get_pool(2).pids())
    for (inner, named, warned, pids), n in zip(out, (3, 4)):
        assert inner == named == [i * i for i in range(n)]
        assert warned == []
        assert not set(pids) & outer and len(pids) == n  # not in the task's own worker


def test_a_forked_child_starts_with_no_joblib_pool_of_its_parents():
    from fastpool._integrations import _joblib_pools

    with run():
        assert Parallel()(delayed(T.square)(i) for i in range(4)) == [0, 1, 4, 9]
    assert _joblib_pools.live_pools()
    pid = os.fork()
    if pid == 0:  # a nested Parallel in a worker starts from here: its own pool and reaper
        code = 2
        try:
            alone = not _joblib_pools.live_pools() and not _joblib_pools._reaper
            code = 0 if alone and _joblib_pools._cond.acquire(blocking=False) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_tasks_exception_keeps_its_type_and_message_and_the_pool_goes_on():
    with run():
        with pytest.raises(T.OddError, match="odd thing 7"):
            Parallel()(
                delayed(T.raise_odd)(f"odd thing {i}") if i == 7 else delayed(T.square)(i)
                for i in range(10)
            )
        assert Parallel()(delayed(T.square)(i) for i in range(3)) == [0, 1, 4]


def test_an_argument_that_cannot_be_pickled_fails_the_call_instead_of_hanging_it():
    import threading

    lock = threading.Lock()  # joblib submits later batches from a callback: a raise there is lost
    with run():
        with pytest.raises(fastpool.SerializationError, match="lock"):
            Parallel()(delayed(T.square)(lock if i == 2500 else i) for i in range(3000))
        assert Parallel()(delayed(T.square)(i) for i in range(3)) == [0, 1, 4]


# ---- arrays --------------------------------------------------------------------------


def test_large_arrays_cross_read_only_through_one_shared_copy():
    x = np.arange(2**18, dtype=np.float64)  # 2 MiB: over joblib's 1 MB max_nbytes
    with run():
        facts = Parallel()(delayed(T.array_facts)(x) for _ in range(4))
        with pytest.raises(ValueError, match="read-only"):
            Parallel()(delayed(T.write_first)(x) for _ in range(2))
    assert {f[:2] for f in facts} == {(False, float(x.sum()))}
    assert len({f[2] for f in facts}) == 1 and facts[0][2] is not None  # one block for the call
    assert x[0] == 0.0


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_an_array_subclass_over_max_nbytes_arrives_as_its_class():
    # 2.4 MB each: over max_nbytes, so each crosses as the call's shared copy
    mask = np.zeros(300_000, dtype=bool)
    mask[:100_000] = True
    masked = np.ma.masked_array(np.ones(300_000), mask=mask)
    matrix = np.matrix(np.ones((500, 600)))
    with run():
        assert (
            Parallel()(delayed(T.kind_and_sum)(masked) for _ in range(2))
            == [("MaskedArray", 200_000.0)] * 2
        )  # the mask crossed too: the masked third is not counted
        facts = Parallel()(delayed(T.kind_and_sum)(matrix) for _ in range(2))
        shared = Parallel()(delayed(T.array_facts)(matrix) for _ in range(2))
    assert facts == [("matrix", 300_000.0)] * 2
    assert shared[0][2] is not None and shared[0][2] == shared[1][2]  # one shared copy


def test_small_arrays_are_private_writable_copies():
    x = np.ones(1000)
    with run():
        assert Parallel()(delayed(T.write_first)(x) for _ in range(2)) == [-1.0, -1.0]
    assert x[0] == 1.0


@pytest.mark.parametrize("config", [{"mmap_mode": "r+"}, {"mmap_mode": "w+"}])
def test_mmap_mode_r_plus_shares_a_writable_copy(config):
    x = np.ones(2**18)
    with run(**config):
        facts = Parallel()(delayed(T.array_facts)(x) for _ in range(2))
        assert Parallel()(delayed(T.write_first)(x) for _ in range(1)) == [-1.0]
    assert {f[0] for f in facts} == {True} and facts[0][2] is not None
    assert x[0] == 1.0  # as with joblib's memmap: the caller's array is not written


@pytest.mark.parametrize("config", [{"mmap_mode": None}, {"max_nbytes": None}, {"mmap_mode": "c"}])
def test_without_memmapping_each_task_gets_its_own_copy(config):
    x = np.ones(2**18)
    with run(**config):
        facts = Parallel()(delayed(T.array_facts)(x) for _ in range(2))
        assert Parallel()(delayed(T.write_first)(x) for _ in range(2)) == [-1.0, -1.0]
    assert {f[0] for f in facts} == {True}
    assert x[0] == 1.0


def test_a_result_in_shared_memory_passed_again_is_read_only_for_the_task():
    with run():
        made = Parallel()(delayed(np.ones)(2**18) for _ in range(1))[0]  # born in shared memory
        facts = Parallel()(delayed(T.array_facts)(made) for _ in range(2))
        small = made[:10]  # shared memory too, under max_nbytes: a private copy, as pickled
        assert Parallel()(delayed(T.write_first)(small) for _ in range(1)) == [-1.0]
    assert {f[0] for f in facts} == {False} and facts[0][2] is not None
    assert made[0] == 1.0 and small[0] == 1.0


def test_an_array_the_user_shared_crosses_without_a_copy():
    pool = fastpool.joblib.get_pool(2)
    x = pool.share(np.arange(2**18, dtype=np.float64), readonly=True)
    with run():
        facts = Parallel()(delayed(T.array_facts)(x) for _ in range(2))
    assert facts[0] == facts[1] == (False, float(x.sum()), facts[0][2])


# ---- pools ---------------------------------------------------------------------------


def test_an_idle_pool_retires_after_idle_worker_timeout():
    with run(idle_worker_timeout=0.2, hang_timeout=55.0):
        Parallel()(delayed(T.square)(i) for i in range(2))
    pool = fastpool.joblib.get_pool(2, hang_timeout=55.0)
    wait_for(lambda: pool.stats()["closed"], 10.0, "the idle pool to retire")
    with run(hang_timeout=55.0):  # a new pool for the next call
        assert Parallel()(delayed(T.square)(i) for i in range(2)) == [0, 1]
    fastpool.joblib.get_pool(2, hang_timeout=55.0).shutdown()


def test_shutdown_ends_every_pool_and_the_next_call_starts_one():
    with run(max_tasks_per_worker=1000):
        pids = set(Parallel()(delayed(T.pid_of)(i) for i in range(4)))
    fastpool.joblib.shutdown()
    wait_for(lambda: not (pids & workers_alive()), LEAK_GRACE_S, "its workers to be gone")
    with run():
        assert Parallel()(delayed(T.square)(i) for i in range(3)) == [0, 1, 4]


def test_equal_options_built_afresh_share_one_pool():
    # initargs is a list built anew for each call: equal by value, never the same object
    def options(initargs: list) -> dict:
        return {"initializer": T.set_offset, "initargs": (initargs,), "max_queue": 777}

    def call() -> int:
        with run(**options([1, 2])):
            Parallel()(delayed(T.square)(i) for i in range(2))
        return id(fastpool.joblib.get_pool(2, **options([1, 2])))

    first = call()
    assert call() == first and call() == first
    other = fastpool.joblib.get_pool(2, **options([1, 3]))
    assert id(other) != first
    other.shutdown()


def test_no_warning_from_a_plain_call():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with run():
            Parallel()(delayed(T.square)(i) for i in range(20))


def test_parallel_calls_from_several_threads_share_one_pool():
    from concurrent.futures import ThreadPoolExecutor

    def one(k: int) -> tuple[list[int], int]:
        with run(max_queue=4096):
            out = Parallel()(delayed(T.square)(i) for i in range(k, k + 200))
        return out, id(fastpool.joblib.get_pool(2, max_queue=4096))

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, range(0, 800, 100)))
    expected = [[i * i for i in range(k, k + 200)] for k in range(0, 800, 100)]
    assert [r[0] for r in results] == expected
    assert len({r[1] for r in results}) == 1
