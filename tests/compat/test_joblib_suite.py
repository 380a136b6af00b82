# ruff: noqa: E501 - the ids of joblib's tests are as long as joblib made them
"""joblib 1.6.0's own ``test_parallel.py`` and ``test_memmapping.py`` against the fastpool
backend: a peer suite.

The installed ``joblib/test`` files run unchanged in a child ``python -m pytest``
(tests/_peer_pytest.py) with the plugin
tests/compat/joblib_suite/joblib_fastpool_plugin.py, which adds a ``"fastpool"`` case
after every ``"loky"`` case of a backend parametrization (and registers the backend before
the modules are imported, so that lists built from ``joblib.parallel.BACKENDS`` hold it).
The scripts the tests start resolve ``"fastpool"`` too: for the run, a ``.pth`` file in the
venv's site-packages imports joblib_suite/hook/_fastpool_joblib_hook.py in every interpreter
that has ``FASTPOOL_JOBLIB_SUITE`` set (those scripts replace PYTHONPATH, so a .pth file is
the one way in); it is removed after the run and does nothing where the variable is unset.

Every fastpool case must pass, be skipped by joblib, or fail as listed in EXPECTED_FAILURES,
each a row of docs/joblib.md ("joblib's own tests") with its reason; every loky case, the
control, must pass or be skipped.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

import joblib
import pytest
from _peer_pytest import PLUGIN_DIR, ROOT, count, run_suite, undocumented

HOOK_DIR = PLUGIN_DIR / "hook"
FILES = ("test_parallel.py", "test_memmapping.py")
PTH_NAME = "_fastpool_joblib_suite.pth"
PLUGIN = "joblib_fastpool_plugin"


_NESTED_MP = (
    "joblib's multiprocessing backend inside a fastpool task runs in parallel: a fastpool "
    "worker is neither a daemonic multiprocessing process nor a loky worker, so joblib does "
    "not warn and set n_jobs=1 as it does below loky"
)
_IN_MP_WORKER = (
    "inside a multiprocessing.Pool worker (a daemon) the fastpool backend starts its pool and "
    "runs in parallel; loky cannot start processes there, so it warns and sets n_jobs=1"
)
_BELOW_THREADS = (
    "below a thread the fastpool backend runs in parallel, on the thread-safe pool of its "
    "configuration that the other threads share; loky warns and sets n_jobs=1"
)
_MEMMAP = (
    "the task checks that its argument is an np.memmap: fastpool ships arrays over max_nbytes "
    "as read-only arrays over shared memory (a memfd), with no file behind them"
)
_FILENAME = (
    "the task reads the argument's .filename, an np.memmap's: no file backs fastpool's shared "
    "copies, and no temp folder is made"
)
_SHARED_EXECUTOR = (
    "expects loky's error: the first generator's collection shuts loky's one shared executor "
    "down, so the second call raises RuntimeError; on fastpool it aborts the first call only "
    "and the second call runs, as on threading"
)
_GENERATOR_ROWS = [
    f"test_multiple_generator_call_separated_gc[{a}-{b}-fastpool-True]"
    for a in ("generator", "generator_unordered")
    for b in ("generator", "generator_unordered")
]

# test id -> why it fails on fastpool: each is a row of docs/joblib.md, "joblib's own tests"
EXPECTED_FAILURES: dict[str, str] = {
    "test_nested_parallel_warnings[fastpool-multiprocessing-True]": _NESTED_MP,
    "test_nested_parallel_warnings[multiprocessing-fastpool-True]": _IN_MP_WORKER,
    "test_nested_parallel_warnings[threading-fastpool-True]": _BELOW_THREADS,
    "test_error_capture[fastpool]": (
        "reads the backend's private _pool or _workers and asserts that an error replaced the "
        "pool; fastpool cancels the failed call's batches and keeps its pool"
    ),
    "test_auto_memmap_on_arrays_from_generator[fastpool]": _MEMMAP,
    "test_memmapping_leaks[fastpool]": _MEMMAP,
    "test_memmap_returned_as_regular_array[fastpool]": _MEMMAP,
    "test_parallel_isolated_temp_folders[fastpool]": _FILENAME,
    "test_managed_backend_reuse_temp_folder[fastpool]": _FILENAME,
    "test_child_raises_parent_exits_cleanly[fastpool]": (
        "its script reads the backend's private _pool._temp_folder and a memmap's filename: "
        "fastpool makes no temp folder"
    ),
    **dict.fromkeys(_GENERATOR_ROWS, _SHARED_EXECUTOR),
}


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _write_pth() -> Path:
    pth = _site_packages() / PTH_NAME
    hook = (
        "import os; os.environ.get('FASTPOOL_JOBLIB_SUITE') and __import__('_fastpool_joblib_hook')"
    )
    pth.write_text(f"{HOOK_DIR}\n{hook}\n")
    return pth


def _ok(row: dict) -> bool:
    # xpassed: a case joblib marks xfail(strict=False) that passed (joblib accepts it)
    return row["outcome"] in ("passed", "skipped", "xfailed", "xpassed")


def test_every_expected_failure_is_a_documented_row() -> None:
    missing = undocumented(EXPECTED_FAILURES)
    assert not missing, f"not in docs/joblib.md: {missing}"


@pytest.mark.peer_suite
@pytest.mark.timeout(900)
def test_joblib_suite_passes_or_fails_as_listed(tmp_path: Path) -> None:
    tests = Path(joblib.__file__).parent / "test"
    if not os.access(_site_packages(), os.W_OK):
        pytest.skip(f"{_site_packages()} is not writable: the scripts' hook cannot be installed")
    # TMPDIR only (run_suite's): JOBLIB_TEMP_FOLDER fails test_memmapping_on_large_enough_dev_shm
    pth = _write_pth()
    env = {"FASTPOOL_JOBLIB_SUITE": str(ROOT)}
    try:
        rows = run_suite(
            tmp_path, tests.parent, [str(tests / f) for f in FILES], [PLUGIN], env, 840
        )
        # A failed control case (joblib's own backends: loky, multiprocessing, threading)
        # runs once more, alone: one such case, joblib's multiprocessing backend starting
        # an mp.Manager whose server process died at birth (EOFError), failed once in a
        # dozen full runs and passed alone.  fastpool's own cases get no second run.
        again = [n for n, r in rows.items() if r["kind"] != "fastpool" and not _ok(r)]
        if again:
            print(f"control cases run again: {again}", file=sys.stderr)
            targets = [str(tests.parent / n) for n in again]
            rows.update(run_suite(tmp_path / "again", tests.parent, targets, [PLUGIN], env, 300))
    finally:
        pth.unlink()
    bad = []
    for nodeid, row in rows.items():
        key = nodeid.split("::", 1)[1]
        if row["kind"] == "fastpool" and key in EXPECTED_FAILURES:
            if row["outcome"] != "failed":
                bad.append(f"{key}: listed as an expected failure, but {row['outcome']}")
        elif not _ok(row):
            bad.append(f"{row['kind']} {key}: {row['outcome']}\n{row['detail']}")
    counts = count(rows)
    print(json.dumps(counts), file=sys.stderr)
    assert counts.get("fastpool", {}).get("passed", 0) >= 140, counts  # the suite really ran
    assert not bad, "\n\n".join(bad)
