"""fastpool.dask without a cluster: the missing extra, errors that cross processes,
the chunk runner the children execute, the argument walker."""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys

import pytest

from fastpool._integrations._dask_child import apply_items
from fastpool._runtime._call import ChunkFailure
from fastpool.errors import RemoteError, WorkerCrashed, WorkerMemoryError

pytestmark = pytest.mark.dask


def _fastpool_dask():
    pytest.importorskip("distributed", reason="needs the dask extra: pip install -e '.[dask]'")
    import fastpool.dask

    return fastpool.dask


def test_without_distributed_the_import_names_the_extra():
    # distributed blocked in a fresh interpreter: whatever is installed here
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "import fastpool\n"
        "try:\n    import fastpool.dask\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'fastpool[dask]'" in out.stdout


def _square(x):
    return x * x


def _bad_at_3(x):
    if x == 3:
        raise KeyError(x)
    return x


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no")


def _raises_unpicklable(x):
    raise _Unpicklable("lost")


def test_a_chunk_returns_results_and_its_run_time():
    out, run_s = apply_items(_square, [1, 2, 3], False)
    assert out == [1, 4, 9] and run_s >= 0
    assert apply_items(max, [(1, 2), (5, 4)], True)[0] == [2, 5]


def test_a_failing_chunk_keeps_the_results_before_the_failure():
    failure, _run_s = apply_items(_bad_at_3, [1, 2, 3, 4], False)
    assert type(failure) is ChunkFailure  # the one type for a partly failed chunk
    again = pickle.loads(pickle.dumps(failure))  # it crosses back from the child
    results, error = again.unpack()
    assert results == [1, 2] and type(error) is KeyError


def test_an_unpicklable_error_in_a_chunk_becomes_remote_error_and_keeps_the_results():
    failure, _run_s = apply_items(_raises_unpicklable, [1], False)
    results, error = pickle.loads(pickle.dumps(failure)).unpack()
    assert results == [] and isinstance(error, RemoteError) and "lost" in error.message


def test_dask_side_errors_pickle_and_keep_their_facts():
    fpd = _fastpool_dask()
    crashed = fpd.DaskWorkerCrashed("tcp://h:1", "KilledWorker ...", "key-1")
    mem = fpd.DaskWorkerMemoryError("tcp://h:2", "restarted", "key-2", 123 << 20)
    for exc in (crashed, mem):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)
        assert again.address == exc.address and again.key == exc.key
    assert isinstance(mem, WorkerMemoryError) and isinstance(mem, WorkerCrashed)
    assert pickle.loads(pickle.dumps(mem)).rss_bytes == 123 << 20
    tb = fpd.DaskRemoteTraceback("Traceback ...", "tcp://h:1", "k")
    assert pickle.loads(pickle.dumps(tb)).text == "Traceback ..."


def test_task_failed_carries_the_error_partial_results_and_where():
    _fastpool_dask()
    from fastpool._integrations._dask_worker import TaskFailed

    tf = TaskFailed(ValueError("x"), "tb", "tcp://h:1", 42, True, [1, 2])
    again = pickle.loads(pickle.dumps(tf))
    assert (
        type(again.error),
        again.traceback_text,
        again.worker,
        again.pid,
        again.closing,
        again.partial,
    ) == (ValueError, "tb", "tcp://h:1", 42, True, [1, 2])
    assert repr(again) == "TaskFailed(ValueError('x'))"  # what Dask logs: short


def test_the_walker_finds_handles_in_containers_and_partials_and_leaves_the_rest():
    _fastpool_dask()
    from fastpool._integrations._dask_worker import swap

    marker = object()
    repl = lambda x: "R" if x is marker else x  # noqa: E731
    args = (1, [marker, {"k": (marker,)}], functools.partial(_square, marker))
    out = swap(args, repl)
    assert out[0] == 1 and out[1] == ["R", {"k": ("R",)}]
    assert out[2].args == ("R",) and out[2].func is _square
    untouched = (1, [2, {"k": 3}])
    assert swap(untouched, repl) is untouched  # no copy when nothing changes


def test_the_plugin_refuses_arguments_pool_does_not_take():
    fpd = _fastpool_dask()
    with pytest.raises(TypeError, match="wrokers"):
        fpd.FastpoolPlugin(wrokers=2)
    plugin = fpd.FastpoolPlugin("p", task_timeout=5)
    again = pickle.loads(pickle.dumps(plugin))  # how Dask ships it to each worker
    assert (again.name, again.pool_kwargs, again.pool) == ("p", {"task_timeout": 5}, None)


def test_settings_compare_by_name_shape_and_value_not_identity():
    _fastpool_dask()
    import numpy as np

    from fastpool._integrations._dask_worker import describe_settings

    a = describe_settings({"initializer": _square, "initargs": (np.ones(3), 2), "task_timeout": 5})
    b = describe_settings({"task_timeout": 5, "initargs": (np.zeros(3), 2), "initializer": _square})
    assert a == b  # arrays by shape and dtype: comparing elements would raise, not compare
    assert a != describe_settings({"task_timeout": 6})
