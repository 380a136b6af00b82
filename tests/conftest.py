"""Fixtures: pools, the contract-suite executor, and a leak check for real-worker tests.

The leak check wraps every test under tests/integration and tests/faults: after the
test (and after the pool fixtures' teardown, which runs first), no process it started
may still be alive 5 s later, no new /dev/shm entry may remain, and this process holds
no fd it did not hold before: compared by what each fd points at (its /proc/self/fd
link), so an fd closed and another one opened in its place is still a leak.

The session makes itself a child subreaper (Linux), so that a process orphaned by a
test (a worker whose template was killed) is re-parented here rather than to init and
is still counted among this process's descendants.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import re
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
from _waiting import wait_for

import fastpool
from fastpool._runtime import _template

LEAK_GRACE_S = 5.0  # the brief: a worker may take this long to go after shutdown
SHUTDOWN_LIMIT_S = 30.0
_CHECKED_DIRS = ("integration", "faults")


_PR_SET_CHILD_SUBREAPER = 36


def pytest_configure(config: pytest.Config) -> None:
    """Become a child subreaper before any test starts a process (see the module docstring),
    and let the scripts tests start hear SIGINT even when this run ignores it.

    Orphans re-parented here are never waited for: they stay as zombies until the
    session ends, which the checks below count as gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started as a background job of a non-interactive shell (`cmd &`): SIGINT is
        # ignored here, every script a test starts would inherit that, and the Ctrl-C
        # tests' scripts would run on through the SIGINT they are sent.
        signal.signal(signal.SIGINT, signal.default_int_handler)


PEER_SUITES_OPTION = "--peer-suites"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        PEER_SUITES_OPTION,
        action="store_true",
        help="also run the tests marked peer_suite: other projects' own suites (CPython's "
        "multiprocessing pool tests, joblib's, scikit-learn's) through their adapters; "
        ".ci/run runs them in a step of their own, after the README's test command",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the peers' own suites unless --peer-suites is given: they take minutes each, and
    the README's test command must stay under 10 minutes (.ci/run runs them next)."""
    if config.getoption(PEER_SUITES_OPTION):
        return
    skip = pytest.mark.skip(reason="a peer's own suite: run with --peer-suites (.ci/run does)")
    for item in items:
        if item.get_closest_marker("peer_suite") is not None:
            item.add_marker(skip)


# ---- pools -------------------------------------------------------------------------


def shutdown_within(pool: fastpool.Pool, limit_s: float = SHUTDOWN_LIMIT_S, **kwargs: Any) -> None:
    """pool.shutdown(wait=True), failing the test if it does not return in limit_s.

    A hang here is a fastpool bug the test should report as such, not as a
    pytest-timeout of the whole item; the workers are SIGKILLed so the rest of the
    suite does not inherit them."""
    pids = list(pool.pids())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pool.shutdown(wait=True, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(exc)

    t = threading.Thread(target=run, name="test-shutdown", daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        for p in set(pids) | set(pool.pids()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        # fastpool's atexit hook would run the same hung shutdown again and keep
        # this interpreter from ever exiting; the test already reports the hang.
        fastpool.pool._live_pools.discard(pool)
        pytest.fail(
            f"pool.shutdown(wait=True) did not return within {limit_s:g} s (stats: {pool.stats()})"
        )
    if errors:
        raise errors[0]


@contextlib.contextmanager
def make_pool(*args: Any, **kwargs: Any) -> Iterator[fastpool.Pool]:
    """A Pool for one test, shut down (with the hang guard) however the test ends."""
    pool = fastpool.Pool(*args, **kwargs)
    try:
        yield pool
    finally:
        shutdown_within(pool, cancel_futures=True)


@pytest.fixture
def pool() -> Iterator[fastpool.Pool]:
    """fastpool.Pool(2), shut down after the test."""
    with make_pool(2) as p:
        yield p


@pytest.fixture(params=["fastpool", "process_pool_executor"])
def executor(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The contract suite's subject: fastpool.Pool(2) or ProcessPoolExecutor(2).

    ProcessPoolExecutor uses forkserver: this process runs threads (fastpool's
    supervisor and collector, the tests' submitters), and forking a threaded
    process can copy a lock some other thread held.  Its workers start from the
    forkserver, which is single-threaded."""
    if request.param == "fastpool":
        with make_pool(2) as p:
            yield p
    else:
        ex = ProcessPoolExecutor(
            max_workers=2, mp_context=multiprocessing.get_context("forkserver")
        )
        try:
            yield ex
        finally:
            ex.shutdown(wait=True, cancel_futures=True)


# ---- leak check --------------------------------------------------------------------


def _helpers_pids() -> set[int]:
    """Children that live as long as this process by design, not per test.

    fastpool's template (it forks the workers), and the stdlib's forkserver and
    resource tracker that the ProcessPoolExecutor leg starts once.  The template
    is looked up each time: a test may stop it (shutdown_template) and the next
    pool starts a new one."""
    pids = {_template.template().pid}
    pids.add(getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None))
    pids.add(getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None))
    pids.discard(None)
    return pids  # type: ignore[return-value]


def _helpers_fds() -> set[int]:
    """fds of the long-lived helpers: the template's control socket.  A test that
    kills or stops the template makes the next pool open a new one, which lives
    as long as the template does, like the one it replaced."""
    ctl = getattr(_template.template(), "_ctl", None)
    try:
        return {ctl.fileno()} if ctl is not None else set()
    except OSError:  # closed meanwhile
        return set()


def _fds_but_helpers() -> dict[int, str]:
    """This process's fds less the helpers' at this moment: a template replaced
    during the test swaps one for another, while the replaced one, if it were still
    open, counts as leaked."""
    helpers = _helpers_fds()
    return {fd: target for fd, target in _fds().items() if fd not in helpers}


@pytest.fixture(scope="session")
def _helpers_running() -> None:
    """Starts the long-lived helpers before any baseline is taken, so the first
    test is not charged with their processes and fds."""
    with make_pool(1) as p:
        p.submit(int).result(timeout=60)
    multiprocessing.forkserver.ensure_running()  # also starts the resource tracker


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:  # a zombie has exited
                out.add(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _descendants() -> set[int]:
    """Every process below this one: fastpool workers hang under the template,
    ProcessPoolExecutor's forkserver workers under the forkserver."""
    return {c.pid for c in psutil.Process().children(recursive=True)}


def _describe(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return f"pid {pid} (parent {proc.ppid()}, {' '.join(proc.cmdline())[:60]!r})"
    except psutil.Error:
        return f"pid {pid}"


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the fd listdir itself used, closed by now
    return out


def _new_fds(before: dict[int, str], after: dict[int, str]) -> dict[int, str]:
    """The fds in ``after`` that ``before`` does not account for, compared by target.

    Targets are counted, not just collected: pidfds, epolls and eventfds all read
    ``anon_inode:[...]``, so one more of them is a leak too.  A pipe or memfd that
    did not exist before is a leak even if some other fd closed meanwhile and the
    total stayed the same."""
    extra = collections.Counter(after.values()) - collections.Counter(before.values())
    changed = [fd for fd in after if before.get(fd) != after[fd]]
    out = {}
    for fd in changed + [fd for fd in after if fd not in changed]:  # blame changed fds first
        if extra[after[fd]] > 0:
            extra[after[fd]] -= 1
            out[fd] = after[fd]
    return out


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


# Names that carry their creator's pid: fastpool's fp_<pid>_<random>, joblib's and loky's.
_PID_IN_NAME = re.compile(r"^(?:fp_|joblib_memmapping_folder_|sem\.loky-|loky-)(\d+)[_-]")


def _tqdm_lock() -> set[str]:
    """The /dev/shm name of tqdm's process-wide write lock, if tqdm made it.

    tqdm's first bar makes ``TqdmDefaultWriteLock.mp_lock``, a ``multiprocessing.RLock``
    that lives as long as the process.  Under fork (multiprocessing's default before
    3.14) its POSIX semaphore is unlinked at once; under forkserver (3.14's default on
    Linux) it keeps its name, ``/dev/shm/sem.mp-*``, until multiprocessing's exit
    finalizer (or its resource tracker, after a kill) unlinks it.  It is tqdm's, made in
    this process by tqdm: fastpool makes no POSIX semaphore (its shared memory is memfd)."""
    std = sys.modules.get("tqdm.std")
    lock = getattr(getattr(std, "TqdmDefaultWriteLock", None), "mp_lock", None)
    name = getattr(getattr(lock, "_semlock", None), "name", None)
    return {"sem." + name.lstrip("/")} if name else set()


def _foreign_shm(names: set[str]) -> set[str]:
    """The new /dev/shm entries another process tree made while the test ran.

    Other engineers run benchmarks and test suites on this machine at the same
    time, so a new entry is only charged to this test when it cannot be
    attributed elsewhere: its name carries a live pid outside this process tree,
    or a process outside this tree has it mapped (multiprocessing's sem.mp-*
    names carry no pid, but their owner maps them), or it is tqdm's process-wide
    lock (``_tqdm_lock``).  Any other semaphore this process made is charged."""
    tree = {os.getpid()} | _descendants()
    foreign = names & _tqdm_lock()
    for name in names:
        m = _PID_IN_NAME.match(name)
        if m and int(m.group(1)) not in tree and psutil.pid_exists(int(m.group(1))):
            foreign.add(name)
    rest = names - foreign
    if not rest:
        return foreign
    for pid in psutil.pids():
        if pid in tree:
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except OSError:
            continue
        foreign |= {name for name in rest if f"/dev/shm/{name}" in maps}
    return foreign


@pytest.fixture(autouse=True)
def _leak_check(request: pytest.FixtureRequest) -> Iterator[None]:
    if not any(part in _CHECKED_DIRS for part in Path(str(request.node.path)).parts):
        yield
        return
    request.getfixturevalue("_helpers_running")
    gc.collect()
    procs0 = _descendants()
    shm0 = _shm()
    fds0 = _fds_but_helpers()
    yield

    # Whatever the test started, at any depth: fastpool workers (replacements
    # included), ProcessPoolExecutor workers, a second template.  All must be
    # gone LEAK_GRACE_S after the pools were shut down.
    left: dict[str, Any] = {}

    def nothing_left() -> bool:
        gc.collect()  # executors dropped by the test release their queues and pipes
        left["procs"] = _alive(_descendants() - procs0 - _helpers_pids())
        left["new_fds"] = _new_fds(fds0, _fds_but_helpers())
        shm = _shm() - shm0
        if shm:
            shm -= _foreign_shm(shm)
        left["shm"] = shm
        # Zero tolerance: every fd a pool opens (board memfd, template socket,
        # wake pipe, epoll, pidfds) is closed by shutdown, and the helpers' fds
        # were opened before the baseline.
        return not any(left.values())

    try:
        wait_for(nothing_left, LEAK_GRACE_S, poll_s=0.05)
        return
    except AssertionError:
        procs, new_fds, shm = left["procs"], left["new_fds"], left["shm"]
    problems = []
    if procs:
        problems.append(
            f"processes still alive {LEAK_GRACE_S:g} s after shutdown: "
            + ", ".join(_describe(p) for p in sorted(procs))
        )
    if new_fds:
        problems.append(f"fds opened and not closed: {new_fds}")
    if shm:
        problems.append(f"new /dev/shm entries: {sorted(shm)}")
    pytest.fail("leak after the test: " + "; ".join(problems))
