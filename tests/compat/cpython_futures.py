"""Run CPython's own ``test.test_concurrent_futures`` executor suites against ``fastpool.Pool``.

Only this adapter lives in the repository: the tests come from the interpreter's own ``test``
package (pyenv's CPython 3.13 ships it; most distribution builds strip it). Run it with an
interpreter that has both that package and fastpool installed::

    python3.13 tests/compat/cpython_futures.py [-v] [--json FILE]

The adapter maps ``max_workers``, ``initializer``, ``initargs`` and ``max_tasks_per_child`` onto
``fastpool.Pool`` and reuses the suites' mixins unchanged through one executor type. Two kinds
of test do not count:

- ``SKIPPED``: tests that read or patch ``ProcessPoolExecutor`` internals (``_processes``,
  ``_executor_manager_thread``, ``_mp_context`` ...) or construct a ``ProcessPoolExecutor``
  themselves, so they say nothing about the executor under test. Each has its reason.
- ``EXPECTED_FAILURES``: deliberate differences from ``ProcessPoolExecutor``, each with its
  reason; docs/migrating.md lists the same ones in its table of differences. They are judged
  by the runner, not by ``unittest.expectedFailure``, because one of them kills the process
  that runs it: each test runs in a child process, and a child that dies marks its test
  "crashed" while a fresh child goes on with the rest.

The process exits 0 when every test passed, was skipped with a reason, or failed as expected,
and 1 otherwise (an unexpected failure, or an expected failure that now passes). With ``--json``
it writes the counts and the outcome of each test.
"""

from __future__ import annotations

import sys
import unittest

import _adapter

import fastpool

# test id (class name without the "Fastpool" prefix, then the method) -> why it is skipped
SKIPPED: dict[str, str] = {
    "ProcessPoolExecutorTest.test_killed_child": (
        "reads executor._processes to terminate a worker"
    ),
    "ProcessPoolExecutorTest.test_saturation": "reads executor._processes",
    "ProcessPoolExecutorTest.test_idle_process_reuse_one": "reads executor._processes",
    "ProcessPoolExecutorTest.test_idle_process_reuse_multiple": "reads executor._processes",
    "ProcessPoolExecutorTest.test_max_tasks_per_child": "reads executor._processes",
    "ProcessPoolExecutorTest.test_max_tasks_per_child_defaults_to_spawn_context": (
        "reads executor._mp_context"
    ),
    "ProcessPoolExecutorTest.test_python_finalization_error": (
        "patches threading._start_joinable_thread to fail ProcessPoolExecutor's second thread"
    ),
    "ProcessPoolExecutorTest.test_max_workers_too_large": "Windows only",
    "ProcessPoolShutdownTest.test_processes_terminate": "reads executor._processes",
    "ProcessPoolShutdownTest.test_context_manager_shutdown": (
        "constructs a ProcessPoolExecutor itself and reads its _processes"
    ),
    "ProcessPoolShutdownTest.test_del_shutdown": (
        "constructs a ProcessPoolExecutor itself and reads its _executor_manager_thread"
    ),
    "ProcessPoolShutdownTest.test_shutdown_no_wait": (
        "constructs a ProcessPoolExecutor itself and reads its _executor_manager_thread"
    ),
    "ExecutorDeadlockTest.test_shutdown_deadlock_pickle": (
        "reads executor._executor_manager_thread"
    ),
    "ExecutorDeadlockTest.test_gh105829_should_not_deadlock_if_wakeup_pipe_full": (
        "patches concurrent.futures.process._ExecutorManagerThread and _ThreadWakeup"
    ),
    # new in 3.14
    "ProcessPoolExecutorTest.test_broken_process_pool_traceback": (
        "reads executor._processes to terminate a worker"
    ),
    "ProcessPoolExecutorTest.test_force_shutdown_workers": (
        "reads executor._processes and wraps each worker's Process.terminate/kill to see them "
        "called; the rest of it (a task waiting on a manager Event is stopped, nothing after "
        "it runs, the with block ends) is tests/integration/test_compat_details.py's "
        "test_terminate_and_kill_workers_stop_a_task_waiting_on_a_manager_event"
    ),
    "ProcessPoolExecutorTest.test_force_shutdown_workers_stops_pool": (
        "reads executor._processes to join a worker; test_compat_details.py's "
        "test_terminate_and_kill_workers_stop_running_and_queued_work checks the same: "
        "submit() raises RuntimeError after it and the worker is gone"
    ),
    "ProcessPoolExecutorTest.test_shutdown_no_wait_max_tasks_gh119592": (
        "reads executor._executor_manager_thread"
    ),
    "ProcessPoolExecutorTest.test_gc_during_max_tasks_worker_exit_gh152967": (
        "reads executor._executor_manager_thread"
    ),
    "ProcessPoolExecutorTest.test_force_shutdown_during_max_tasks_worker_exit": (
        "reads executor._executor_manager_thread and sets executor._force_shutting_down"
    ),
    "ProcessPoolExecutorTest.test_failed_worker_replacement_breaks_pool": (
        "reads executor._executor_manager_thread and patches "
        "concurrent.futures.process._spawn_worker"
    ),
}

# test id -> the deliberate difference that makes it fail (mirrored in docs/migrating.md)
EXPECTED_FAILURES: dict[str, str] = {
    # deliberate differences
    "ProcessPoolExecutorTest.test_traceback": (
        "the cause is fastpool's RemoteTraceback (the same .tb text), not the private class "
        "concurrent.futures.process._RemoteTraceback the test compares by identity"
    ),
    "ProcessPoolShutdownTest.test_cancel_futures": (
        "shutdown(cancel_futures=True) cancels every task no worker has started; right after "
        "the pool is created no worker has, so all 50 are cancelled, where ProcessPoolExecutor "
        "has already moved a few into its call queue"
    ),
    "ProcessPoolShutdownTest.test_submit_after_interpreter_shutdown": (
        "submit after shutdown raises PoolClosed (a RuntimeError) with fastpool's message; "
        "the test matches the text 'RuntimeError: cannot schedule new futures'"
    ),
    "FailingInitializerMixin.test_initializer": (
        "a failing initializer is retried with backoff until the slot's breaker opens "
        "(CircuitOpen, a BrokenExecutor), logged on the 'fastpool' logger; the test wants a "
        "CRITICAL record on 'concurrent.futures' and reads executor._broken (3.14: its setUp "
        "passes a multiprocessing.Queue in initargs for the workers' log records, which "
        "Pool() refuses with TypeError, naming a Manager() queue instead)"
    ),
    "ProcessPoolExecutorTest.test_map_buffersize_without_iterable": (
        "map() with no iterable raises TypeError, as the builtin map() does; Executor.map "
        "returns an empty iterator"
    ),
    "ExecutorDeadlockTest.test_error_at_task_pickle": (
        "a call that cannot be pickled raises SerializationError (a PicklingError) from "
        "submit(), and nothing is queued; the test expects a future failing later"
    ),
    "ExecutorDeadlockTest.test_error_at_task_unpickle": (
        "an error while the worker unpickles the call (UnpicklingError) comes back as that "
        "task's own error; the worker is sound, so the pool is not broken"
    ),
    "ExecutorDeadlockTest.test_exit_at_task_unpickle": (
        "SystemExit while the worker unpickles the call comes back as that task's own "
        "SystemExit, as SystemExit raised by a task does; the pool is not broken"
    ),
    "ExecutorDeadlockTest.test_error_during_result_unpickle_in_result_handler": (
        "a result the parent cannot unpickle fails that one future with SerializationError; "
        "the pool is not broken"
    ),
    "ExecutorDeadlockTest.test_exit_during_result_unpickle_in_result_handler": (
        "SystemExit while the parent unpickles a result fails that one future with "
        "SerializationError (the SystemExit chained), a deliberate difference from "
        "BrokenProcessPool: the pool is not broken"
    ),
}


# Expected failures whose outcome depends on how far the pool's start got when the test
# acts: a pass is not an unexpected success.
EITHER_WAY: dict[str, str] = {
    "ProcessPoolShutdownTest.test_cancel_futures": (
        "it shuts the pool down right after 50 submits and wants at least one task to have "
        "run: it passes when a worker was already ready (the first pool now starts in "
        "about 30 ms) and fails as explained above when none was"
    ),
}


def _load_suites() -> tuple[type, ...]:
    """The mixins of the interpreter's own test package, or SystemExit(2) naming what is
    missing."""
    try:
        from test.test_concurrent_futures import (
            test_as_completed,
            test_deadlock,
            test_init,
            test_process_pool,
            test_shutdown,
            test_wait,
            util,
        )
    except ImportError as exc:
        raise SystemExit(
            f"{sys.executable} has no test.test_concurrent_futures package ({exc}); use an "
            "interpreter built with its test suite, such as pyenv's CPython 3.13"
        ) from exc
    return (
        util,
        test_process_pool,
        test_shutdown,
        test_wait,
        test_as_completed,
        test_init,
        test_deadlock,
    )


class FastpoolExecutor(fastpool.Pool):
    """``fastpool.Pool`` under ``ProcessPoolExecutor``'s constructor signature.

    ``mp_context`` is accepted and ignored: fastpool forks its workers from its own template
    process, whatever the context.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context: object = None,
        initializer: object = None,
        initargs: tuple = (),
        *,
        max_tasks_per_child: int | None = None,
    ) -> None:
        super().__init__(
            max_workers=max_workers,
            initializer=initializer,
            initargs=initargs,
            max_tasks_per_worker=max_tasks_per_child,
        )


def build_suite() -> unittest.TestSuite:
    util, process_pool, shutdown, wait, as_completed, init, deadlock = _load_suites()

    class FastpoolMixin(util.ProcessPoolForkserverMixin):
        """The suites' own forkserver mixin with fastpool as the executor type: whatever
        the interpreter's mixins provide (3.14's ``create_event`` and per-test ``manager``)
        comes with it.  The tests' synchronisation objects (Semaphore, Queue, Manager) use
        the forkserver context; fastpool's template-forked workers are closest to it, and
        the ``mp_context`` the mixin passes is accepted and ignored."""

        executor_type = FastpoolExecutor

    # the shutdown tests' child scripts import the executor type by name from
    # concurrent.futures: they get this adapter's (3.14's scripts pass mp_context=)
    shutdown.assert_python_ok = _adapter.python_ok_with(
        shutdown.assert_python_ok,
        [
            (
                "from concurrent.futures import FastpoolExecutor",
                # 3.13's test_hang_gh83386 calls multiprocessing.set_start_method under
                # a ctx (the forkserver mixin's) without importing it; 3.14's imports it
                "from cpython_futures import FastpoolExecutor; import multiprocessing",
            )
        ],
    )
    mixins = {
        "ProcessPoolExecutorTest": process_pool.ProcessPoolExecutorTest,
        "ProcessPoolShutdownTest": shutdown.ProcessPoolShutdownTest,
        "WaitTests": wait.WaitTests,
        "AsCompletedTests": as_completed.AsCompletedTests,
        "InitializerMixin": init.InitializerMixin,
        "FailingInitializerMixin": init.FailingInitializerMixin,
        "ExecutorDeadlockTest": deadlock.ExecutorDeadlockTest,
    }
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for name, mixin in mixins.items():
        attrs = {"__module__": __name__, **_adapter.skipped(mixin, SKIPPED, name)}
        cls = type(f"Fastpool{name}", (mixin, FastpoolMixin, util.BaseTestCase), attrs)
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


def main(argv: list[str] | None = None) -> int:
    return _adapter.main(
        argv,
        script=__file__,
        description=__doc__.splitlines()[0],
        build_suite=lambda args: build_suite(),
        key_of=_adapter.class_and_method("Fastpool"),
        expected_failures=lambda args: EXPECTED_FAILURES,
        either_way=EITHER_WAY,
        about=lambda args: {"fastpool": fastpool.__version__},
    )


if __name__ == "__main__":
    sys.exit(main())
