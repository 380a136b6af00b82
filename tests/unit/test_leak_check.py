"""The conftest leak check sees what it must: fds by target, orphans as descendants, and
/dev/shm entries charged to their maker (tqdm's process-wide lock is tqdm's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import _descendants, _fds, _new_fds


def test_an_fd_reopened_on_something_new_is_a_leak_though_the_count_is_equal() -> None:
    before = {0: "/dev/null", 1: "pipe:[100]", 5: "/memfd:fastpool-arena (deleted)"}
    after = {0: "/dev/null", 1: "pipe:[100]", 5: "socket:[777]"}
    assert _new_fds(before, after) == {5: "socket:[777]"}


def test_one_more_fd_on_a_shared_target_name_is_a_leak() -> None:
    before = {3: "anon_inode:[pidfd]", 4: "pipe:[1]"}
    after = {3: "anon_inode:[pidfd]", 4: "pipe:[1]", 9: "anon_inode:[pidfd]"}
    assert _new_fds(before, after) == {9: "anon_inode:[pidfd]"}


def test_fds_closed_or_renumbered_are_not_leaks() -> None:
    before = {3: "pipe:[1]", 4: "pipe:[2]", 7: "/tmp/x"}
    assert _new_fds(before, {3: "pipe:[1]"}) == {}
    assert _new_fds(before, {3: "pipe:[1]", 8: "pipe:[2]", 9: "/tmp/x"}) == {}  # dup2'd elsewhere


def test_a_real_pipe_left_open_is_seen() -> None:
    before = _fds()
    r, w = os.pipe()
    try:
        assert set(_new_fds(before, _fds())) == {r, w}
    finally:
        os.close(r)
        os.close(w)
    assert _new_fds(before, _fds()) == {}


def test_an_orphaned_grandchild_is_still_a_descendant() -> None:
    # The session is a child subreaper: when the middle process exits, its child is
    # re-parented to this process, not to init, so the leak check still sees it.
    code = (
        "import os, time\npid = os.fork()\n"
        "if pid == 0:\n    os.close(1)\n    time.sleep(60)\n"  # lets run() see EOF
        "else:\n    print(pid)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=30,
        check=True,
    )
    orphan = int(out.stdout)
    try:
        assert orphan in _descendants()
        assert _parent(orphan) == os.getpid()
    finally:
        os.kill(orphan, signal.SIGKILL)
        os.waitpid(orphan, 0)  # our child now: reap it


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


TESTS = Path(__file__).resolve().parents[1]

# Under forkserver (3.14's default on Linux) a multiprocessing semaphore keeps its name
# in /dev/shm while it lives; set here so that every Python shows it.
SCRIPT = """
import json, multiprocessing, sys
multiprocessing.set_start_method("forkserver")
sys.path.insert(0, sys.argv[1])
import conftest, tqdm
before = conftest._shm()
for _ in tqdm.tqdm(range(3), file=open("/dev/null", "w")):  # tqdm's lock, made by tqdm
    pass
after_tqdm = conftest._shm()
ours = multiprocessing.Lock()  # a semaphore a test (or fastpool) would have made
new = conftest._shm() - before
print(json.dumps({"tqdm": sorted(after_tqdm - before), "new": sorted(new),
                  "foreign": sorted(conftest._foreign_shm(new))}))
"""


def test_tqdms_lock_is_not_charged_but_another_semaphore_is() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout.splitlines()[-1])
    assert len(seen["tqdm"]) == 1 and seen["tqdm"][0].startswith("sem.mp-")
    assert len(seen["new"]) == 2  # tqdm's and ours
    assert seen["foreign"] == seen["tqdm"]  # ours is still charged
