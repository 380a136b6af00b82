"""One Dask LocalCluster for every test in tests/dask, and a check that it leaves
no process behind.

The cluster (2 workers x 1 thread, real processes under nannies) starts on first use
and closes after the last test of this directory, not at the end of the session:
the leak checks of tests/integration and tests/faults count this process's fds and
children, and an idle cluster would keep opening sockets under them.

Every process the cluster starts carries FASTPOOL_DASK_TEST_TAG in its environment
(the nannies pass it to their workers, workers to their fastpool templates, the
templates to their children), so after the cluster closes the check finds any
survivor, even one orphaned by a SIGKILLed Dask worker and re-parented to init.
"""

from __future__ import annotations

import os
import select
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

HERE = Path(__file__).parent
# Before any cluster exists: Dask's spawned workers and fastpool's spawned templates
# copy sys.path, so _dask_tasks pickles by reference everywhere.  Appended, not
# prepended: `from conftest import ...` elsewhere must keep finding tests/conftest.py.
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from _dask_support import LEAK_GRACE_S, TAG_VAR, describe, tagged_processes  # noqa: E402


class ClusterHolder:
    """The session's cluster and client, closed by close() (idempotent) with the leak check."""

    def __init__(self) -> None:
        self.cluster: Any = None
        self.client: Any = None
        self.tag = uuid.uuid4().hex

    def start(self) -> None:
        import dask
        from distributed import Client, LocalCluster

        # Dask's active memory manager drops the extra copies of a key no task waits
        # for, every 2 s: a broadcast array could lose its copy on one worker between
        # the scatter and that worker's first task (docs/dask.md says so to users).  The
        # tests that count transfers need the copies where the scatter put them.
        with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
            self.cluster = LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                env={TAG_VAR: self.tag},
            )
        self.client = Client(self.cluster)

    def close(self) -> None:
        if self.cluster is None:
            return
        client, cluster = self.client, self.cluster
        self.client = self.cluster = None
        client.close()
        cluster.close()
        _gone, alive = psutil.wait_procs(tagged_processes(self.tag), timeout=LEAK_GRACE_S)
        if alive:
            pytest.fail(
                f"{len(alive)} process(es) of the Dask cluster outlived it by "
                f"{LEAK_GRACE_S:g} s: {describe(alive)}"
            )


_HOLDER = ClusterHolder()


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Any]:
    """A distributed.Client on the shared LocalCluster(n_workers=2, threads_per_worker=1)."""
    pytest.importorskip(
        "distributed", reason="the Dask tests need the dask extra: pip install -e '.[dask]'"
    )
    if _HOLDER.cluster is None:
        _HOLDER.start()
    yield _HOLDER.client
    _HOLDER.close()


@pytest.fixture(scope="session")
def cluster_tag(dask_client: Any) -> str:
    return _HOLDER.tag


@pytest.fixture(scope="session")
def executor(dask_client: Any) -> Iterator[Any]:
    """fastpool.dask.Executor on the shared cluster, with the default plugin ("fastpool")."""
    import fastpool.dask

    ex = fastpool.dask.Executor(dask_client)
    yield ex
    ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def clean_cluster(dask_client: Any) -> Any:
    """Restarts every Dask worker (and so every fastpool pool) before the test."""
    dask_client.restart()
    return dask_client


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    # The Dask tests run last.  Dask leaves a thread in this process (its offload
    # pool) after the cluster closes, and fastpool forks its worker template only from
    # a process that runs no other thread, otherwise it spawns one: run first, these
    # tests would switch every later test in the session to a spawned template.
    ours = [it for it in items if HERE in Path(str(it.path)).parents]
    if ours:
        rest = [it for it in items if HERE not in Path(str(it.path)).parents]
        items[:] = rest + ours


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None or HERE not in Path(str(nextitem.path)).parents:
        _HOLDER.close()


class Fifo:
    """A named pipe in tmp_path: a one-way event between the test and a task on this host."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        os.mkfifo(self.path)
        # Opened now, non-blocking, so a task's open-for-writing never blocks on us.
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)

    def wait(self, timeout: float) -> bool:
        """True once a task wrote to it; False after timeout."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        return bool(ready) and os.read(self._fd, 1) == b"1"

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Callable[[str], Fifo]]:
    made: list[Fifo] = []

    def make(name: str) -> Fifo:
        f = Fifo(tmp_path / name)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()
