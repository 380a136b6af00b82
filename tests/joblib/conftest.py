"""The joblib backend's tests share its pools (starting workers and importing
scikit-learn in them is the slow part) within a module, and each module must leave
nothing behind: after its last test, ``fastpool.joblib.shutdown()`` ends every pool,
and no worker process, /dev/shm entry or joblib temporary folder may remain.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

pytest.importorskip("joblib", reason="needs the joblib extra: pip install -e '.[joblib]'")

from _joblib_support import LEAK_GRACE_S, workers_alive  # noqa: E402
from _waiting import wait_for  # noqa: E402

import fastpool.joblib  # noqa: E402


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


# Module scope: tests/joblib is a directory, not a package, so a "package" fixture would
# last the whole session and the pools would outlive these tests into the others'.
@pytest.fixture(scope="module", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    procs0, shm0 = workers_alive(), shm_names()
    yield
    fastpool.joblib.shutdown()
    wait_for(
        lambda: not (workers_alive() - procs0),
        LEAK_GRACE_S,
        lambda: f"processes left after fastpool.joblib.shutdown(): {workers_alive() - procs0}",
    )
    mine = {n for n in shm_names() - shm0 if n.startswith(("fp_", "joblib_", "loky"))}
    assert not mine, f"/dev/shm entries left behind: {mine}"
