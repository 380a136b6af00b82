"""Claims about memory sampling and OOM-kill evidence, against this process, fake /proc
and fake cgroup trees."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import psutil
import pytest

from fastpool._supervision import _memory
from fastpool._supervision._memory import (
    MemorySample,
    OomEvidence,
    ProcessMemory,
    WorkerMemory,
    cgroup_of,
    judge_sigkill,
    leaked,
    limit_hit_count,
    oom_baseline,
    oom_kill_count,
    owned_bytes,
    parse_status,
    read_memory,
    rss_bytes,
    system_oom_kill_count,
)

MiB, GiB = 2**20, 2**30

HYBRID_MOUNTINFO = """\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,relatime shared:4 - cgroup2 cgroup2 rw\n"
V2_EVENTS = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"


def make_root(
    tmp_path: Path, pid: int | str, cgroup: str, mountinfo: str, files: dict[str, str]
) -> Path:
    """A fake root: /proc/<pid>/cgroup, /proc/self/mountinfo, and ``files`` at absolute paths."""
    all_files = {f"/proc/{pid}/cgroup": cgroup, "/proc/self/mountinfo": mountinfo, **files}
    for rel, text in all_files.items():
        path = tmp_path / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def hybrid(
    tmp_path: Path, v1_files: dict[str, str], v2_files: dict[str, str] | None = None
) -> Path:
    files = {f"/sys/fs/cgroup/memory/pool/w1/{k}": v for k, v in v1_files.items()}
    files |= {f"/sys/fs/cgroup/unified/{k}": v for k, v in (v2_files or {}).items()}
    files.setdefault("/sys/fs/cgroup/unified/cgroup.procs", "")
    return make_root(tmp_path, 4242, "4:memory:/pool/w1\n0::/\n", HYBRID_MOUNTINFO, files)


def pure_v2(tmp_path: Path, files: dict[str, str]) -> Path:
    files = {f"/sys/fs/cgroup/app/{k}": v for k, v in files.items()}
    return make_root(tmp_path, 4242, "0::/app\n", V2_MOUNTINFO, files)


# --- reading /proc/<pid>/status ------------------------------------------------

STATUS = """\
Name:\tpython3
State:\tS (sleeping)
Pid:\t4242
VmPeak:\t 2000000 kB
VmHWM:\t  900000 kB
VmRSS:\t  700000 kB
RssAnon:\t  150000 kB
RssFile:\t   50000 kB
RssShmem:\t  500000 kB
VmSwap:\t       0 kB
Threads:\t3
"""
OLD_KERNEL_STATUS = "Name:\tpython3\nVmRSS:\t  700000 kB\nThreads:\t1\n"
ZOMBIE_STATUS = "Name:\tpython3\nState:\tZ (zombie)\nThreads:\t1\n"  # no Vm* lines at all


def fake_proc(tmp_path: Path, pid: int | str, status: str) -> Path:
    (tmp_path / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / str(pid) / "status").write_text(status)
    return tmp_path


def test_owned_memory_is_rss_less_shared_memory() -> None:
    mem = parse_status(STATUS)
    assert mem == ProcessMemory(
        rss_bytes=700000 * 1024,
        anon_bytes=150000 * 1024,
        file_bytes=50000 * 1024,
        shmem_bytes=500000 * 1024,
    )
    assert mem.owned_bytes == 200000 * 1024  # a 500 MB shared array read is not the worker's
    assert mem.owned_bytes == mem.anon_bytes + mem.file_bytes  # type: ignore[operator]


def test_a_kernel_without_the_rss_split_owns_all_of_rss() -> None:
    mem = parse_status(OLD_KERNEL_STATUS)
    assert mem == ProcessMemory(rss_bytes=700000 * 1024)
    assert mem.owned_bytes == mem.rss_bytes


@pytest.mark.parametrize("text", [ZOMBIE_STATUS, "", "VmRSS:\tgarbage kB\n"])
def test_a_status_without_a_readable_rss_is_none(text: str) -> None:
    assert parse_status(text) is None


def test_read_memory_reads_the_status_under_root(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, 4242, STATUS)
    assert read_memory(4242, root=root) == parse_status(STATUS)
    assert rss_bytes(4242, root=root) == 700000 * 1024
    assert owned_bytes(4242, root=root) == 200000 * 1024
    assert read_memory(4243, root=root) is None  # gone
    assert owned_bytes(4242, root=fake_proc(tmp_path / "z", 4242, ZOMBIE_STATUS)) is None


def test_rss_of_this_process_is_plausible_and_matches_psutil() -> None:
    rss = rss_bytes(os.getpid())
    assert rss is not None and rss > 5 * MiB  # an interpreter with numpy loaded
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)
    assert rss_bytes("self") == pytest.approx(rss, rel=0.2)


def test_shared_memory_touched_raises_rss_but_not_what_the_process_owns() -> None:
    fd = os.memfd_create("fastpool-test-shared")  # like the arena: a memfd, so shmem
    try:
        os.ftruncate(fd, 64 * MiB)
        with mmap.mmap(fd, 64 * MiB) as shared:
            before = read_memory(os.getpid())
            view = np.frombuffer(shared, dtype=np.uint8)
            view[::4096] = 1  # every page touched: resident, and shared
            shared_in = read_memory(os.getpid())
            # a fresh anonymous mapping, every page written: private and resident (an array
            # from NumPy's allocator could reuse memory the process already holds)
            with mmap.mmap(-1, 64 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as anon:
                np.frombuffer(anon, dtype=np.uint8)[::4096] = 1
                private_in = read_memory(os.getpid())
            del view
    finally:
        os.close(fd)
    assert before is not None and shared_in is not None and private_in is not None
    assert shared_in.rss_bytes - before.rss_bytes >= 60 * MiB
    assert abs(shared_in.owned_bytes - before.owned_bytes) < 16 * MiB
    assert private_in.owned_bytes - shared_in.owned_bytes >= 60 * MiB


@pytest.mark.parametrize(
    "exc", [psutil.NoSuchProcess(1), psutil.ZombieProcess(1), psutil.AccessDenied(1)]
)
def test_without_proc_a_gone_or_forbidden_process_is_none(
    monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    def vanish(pid: int) -> psutil.Process:
        raise exc

    monkeypatch.setattr(_memory, "_HAVE_PROC", False)  # macOS: psutil's RSS, no split
    monkeypatch.setattr(psutil, "Process", vanish)
    assert rss_bytes(1234) is None


def test_without_proc_psutil_rss_counts_as_owned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "_HAVE_PROC", False)
    mem = read_memory(os.getpid())
    assert mem is not None and mem.shmem_bytes is None and mem.owned_bytes == mem.rss_bytes


def test_rss_of_a_pid_past_pid_max_is_none() -> None:
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except OSError:
        pid_max = 2**22
    assert rss_bytes(pid_max + 1) is None


# --- cgroups and counters ------------------------------------------------------


def test_cgroup_of_finds_both_hierarchies_on_a_hybrid_host(tmp_path: Path) -> None:
    root = hybrid(tmp_path, {"memory.oom_control": V1_OOM_CONTROL})
    cg = cgroup_of(4242, root=root)
    assert cg == {
        "v2": root / "sys/fs/cgroup/unified",
        "v1_memory": root / "sys/fs/cgroup/memory/pool/w1",
    }


def test_cgroup_of_a_gone_pid_is_empty(tmp_path: Path) -> None:
    root = hybrid(tmp_path, {})
    assert cgroup_of(999999, root=root) == {"v2": None, "v1_memory": None}


def test_cgroup_of_this_process_has_the_expected_shape() -> None:
    cg = cgroup_of()
    assert set(cg) == {"v2", "v1_memory"}
    assert all(p is None or p.is_dir() for p in cg.values())


def test_oom_kill_count_v2(tmp_path: Path) -> None:
    root = pure_v2(tmp_path, {"memory.events": V2_EVENTS})
    assert oom_kill_count(cgroup_of(4242, root=root)) == 2  # oom_kill, not oom or oom_group_kill


def test_oom_kill_count_v1(tmp_path: Path) -> None:
    root = hybrid(tmp_path, {"memory.oom_control": V1_OOM_CONTROL})
    assert oom_kill_count(cgroup_of(4242, root=root)) == 5  # the v2 tree has no memory.events


def test_oom_kill_count_v1_on_an_old_kernel_is_none(tmp_path: Path) -> None:
    root = hybrid(tmp_path, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"})
    assert oom_kill_count(cgroup_of(4242, root=root)) is None


def test_oom_kill_count_prefers_v2_when_both_have_it(tmp_path: Path) -> None:
    root = hybrid(tmp_path, {"memory.oom_control": V1_OOM_CONTROL}, {"memory.events": V2_EVENTS})
    assert oom_kill_count(cgroup_of(4242, root=root)) == 2


def test_oom_kill_count_of_nothing_is_none() -> None:
    assert oom_kill_count({"v2": None, "v1_memory": None}) is None


def test_oom_kill_count_on_this_machine_is_none_or_a_count() -> None:
    count = oom_kill_count(cgroup_of())
    assert count is None or (isinstance(count, int) and count >= 0)


def test_limit_hit_count_v2_and_v1(tmp_path: Path) -> None:
    v2 = pure_v2(tmp_path / "a", {"memory.events": V2_EVENTS})
    v1 = hybrid(tmp_path / "b", {"memory.failcnt": "17\n"})
    assert limit_hit_count(cgroup_of(4242, root=v2)) == 3
    assert limit_hit_count(cgroup_of(4242, root=v1)) == 17
    assert limit_hit_count({"v2": None, "v1_memory": None}) is None


def test_system_oom_kill_count(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/vmstat").write_text("nr_free_pages 10\noom_kill 9\nnr_foo 1\n")
    assert system_oom_kill_count(root=tmp_path) == 9
    assert system_oom_kill_count(root=tmp_path / "nowhere") is None
    real = system_oom_kill_count()
    assert real is None or real >= 0


# --- judging a SIGKILL ---------------------------------------------------------


def test_a_rising_counter_confirms_an_oom_kill() -> None:
    confirmed, why = judge_sigkill(0, 1, 900 * MiB, GiB, sent_by_pool=False)
    assert confirmed is True
    assert "rose from 0 to 1" in why and "900 MiB" in why and "1024 MiB" in why


def test_a_steady_counter_clears_the_oom_killer() -> None:
    confirmed, why = judge_sigkill(4, 4, 900 * MiB, GiB, sent_by_pool=False)
    assert confirmed is False
    assert "stayed at 4" in why and "not the OOM killer" in why


def test_a_kill_the_pool_sent_is_never_an_oom_kill() -> None:
    confirmed, why = judge_sigkill(0, 1, 2 * GiB, GiB, sent_by_pool=True)
    assert confirmed is False
    assert "fastpool sent" in why


def test_a_falling_counter_proves_nothing() -> None:
    confirmed, why = judge_sigkill(5, 0, None, None, sent_by_pool=False)
    assert confirmed is False and "proves nothing" in why


def test_without_counters_high_rss_is_likely_but_unconfirmed() -> None:
    confirmed, why = judge_sigkill(None, None, 1000 * MiB, GiB, sent_by_pool=False)
    assert confirmed is False
    assert "likely but unconfirmed" in why and "98%" in why


def test_without_counters_low_rss_leaves_the_sender_unknown() -> None:
    confirmed, why = judge_sigkill(None, 3, 10 * MiB, GiB, sent_by_pool=False)
    assert confirmed is False and "unknown" in why


def test_without_a_limit_the_explanation_says_so() -> None:
    _, why = judge_sigkill(0, 1, None, None, sent_by_pool=False)
    assert "last owned memory (RSS less shared) ?" in why and "no memory limit" in why


def test_a_counter_reading_taken_while_the_worker_dies_does_not_become_the_baseline() -> None:
    # ticks read 0, 0, then 1: the kernel counted its kill of this worker, which has
    # not exited yet. The baseline stays 0, so the death reads as 0 -> 1, an OOM kill.
    before = previous = None
    for count in (0, 0, 1):
        before, previous = oom_baseline(before, previous, count), count
    assert before == 0
    assert judge_sigkill(before, 1, 290 * MiB, 300 * MiB, sent_by_pool=False)[0] is True


def test_a_counter_that_rose_and_held_while_the_worker_lived_is_the_new_baseline() -> None:
    # another process in the cgroup was OOM-killed; this worker lived on
    before = previous = None
    for count in (0, 1, 1):
        before, previous = oom_baseline(before, previous, count), count
    assert before == 1
    assert oom_baseline(None, None, 4) == 4  # the first reading is the baseline
    assert oom_baseline(None, None, None) is None
    assert oom_baseline(2, None, None) == 2  # an unreadable counter keeps what was known


@pytest.mark.parametrize("tree", ["v2", "v1"])
@pytest.mark.parametrize("kills_after, confirmed", [(3, True), (2, False)])
def test_the_verdict_follows_a_fake_cgroup_counter(
    tmp_path: Path, tree: str, kills_after: int, confirmed: bool
) -> None:
    # The spawn-time and reap-time readings of one cgroup's counter, as pool.py takes them.
    if tree == "v2":
        text = "low 0\nhigh 0\nmax 0\noom 0\noom_kill {}\n"
        root = pure_v2(tmp_path, {"memory.events": text.format(2)})
        counter = root / "sys/fs/cgroup/app/memory.events"
    else:
        text = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
        root = hybrid(tmp_path, {"memory.oom_control": text.format(2)})
        counter = root / "sys/fs/cgroup/memory/pool/w1/memory.oom_control"
    cg = cgroup_of(4242, root=root)
    before = oom_kill_count(cg)
    counter.write_text(text.format(kills_after))  # the kernel's OOM kill, or another sender
    after = oom_kill_count(cg)
    assert (before, after) == (2, kills_after)
    got, why = judge_sigkill(before, after, 290 * MiB, 300 * MiB, sent_by_pool=False)
    assert got is confirmed
    assert ("rose from 2 to 3" if confirmed else "stayed at 2") in why


@pytest.mark.parametrize(
    "args",
    [
        (0, 1, 1, 2, False),
        (1, 1, None, None, False),
        (None, None, 5, 10, False),
        (0, 1, 1, 2, True),
        (3, 1, 1, 2, False),
    ],
)
def test_explanations_are_one_line(args: tuple) -> None:
    _, why = judge_sigkill(*args)
    assert why and "\n" not in why


def test_oom_evidence_judges_like_judge_sigkill_and_names_its_scope() -> None:
    ev = OomEvidence(
        before_count=1,
        after_count=2,
        last_rss_bytes=MiB,
        limit_bytes=None,
        sent_by_pool=False,
        scope="system",
    )
    confirmed, why = ev.judge()
    assert confirmed is True and "system OOM-kill counter" in why
    assert ev.judge() == judge_sigkill(1, 2, MiB, None, False, scope="system")


# --- WorkerMemory --------------------------------------------------------------


def test_worker_memory_tracks_current_peak_and_baseline() -> None:
    wm = WorkerMemory(worker_id=0, pid=123)
    assert wm.record(100, 1.0) == MemorySample(pid=123, owned_bytes=100, at=1.0)
    wm.record(300, 2.0)
    wm.record(200, 3.0, rss=900, shmem=700)
    assert (wm.current_bytes, wm.peak_bytes, wm.baseline_bytes) == (200, 300, 100)
    assert (wm.samples, wm.last_at) == (3, 3.0)
    assert (wm.total_rss_bytes, wm.shmem_bytes) == (900, 700)


def test_a_sample_compares_owned_memory_under_its_old_name() -> None:
    # pool.py compares sample.rss_bytes with memory_limit: that must be the owned figure
    sample = MemorySample(pid=1, owned_bytes=200, at=0.0, total_rss_bytes=900, shmem_bytes=700)
    assert sample.rss_bytes == 200


def test_over_limit_compares_the_current_reading() -> None:
    wm = WorkerMemory(worker_id=0, pid=123)
    wm.record(500, 0.0)
    wm.record(100, 1.0)  # the peak of 500 is history
    assert wm.over_limit(None) is False
    assert wm.over_limit(100) is False  # at the limit is not over it
    assert wm.over_limit(99) is True
    assert wm.over_limit(200) is False


def test_sampling_records_what_the_worker_owns_not_its_rss(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, 4242, STATUS)
    wm = WorkerMemory(worker_id=1, pid=4242, root=root)
    first = wm.sample(10.0)
    assert first == MemorySample(4242, 200000 * 1024, 10.0, 700000 * 1024, 500000 * 1024)
    assert not wm.over_limit(300000 * 1024)  # RSS is 700 000 kB, but 500 000 kB of it is shared
    fake_proc(
        tmp_path, 4242, STATUS.replace("150000 kB", "450000 kB").replace(" 700000 kB", "1000000 kB")
    )
    assert wm.sample(11.0).owned_bytes == 500000 * 1024  # type: ignore[union-attr]
    assert wm.over_limit(300000 * 1024)
    assert (wm.samples, wm.baseline_bytes, wm.peak_bytes) == (2, 200000 * 1024, 500000 * 1024)


def test_sampling_this_process_reads_plausible_figures() -> None:
    wm = WorkerMemory(worker_id=1, pid=os.getpid())
    first = wm.sample(10.0)
    assert first is not None and first.owned_bytes > 5 * MiB and first.at == 10.0
    assert first.total_rss_bytes is not None and first.total_rss_bytes >= first.owned_bytes


def test_sampling_a_gone_worker_returns_none_and_keeps_the_last_values(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, 4242, STATUS)
    wm = WorkerMemory(worker_id=2, pid=4242, root=root)
    assert wm.sample(1.0) is not None
    (root / "proc/4242/status").unlink()
    (root / "proc/4242").rmdir()
    assert wm.sample(2.0) is None
    assert (wm.current_bytes, wm.samples, wm.last_at) == (200000 * 1024, 1, 1.0)


@pytest.mark.parametrize(
    "baseline, current, threshold, expected",
    [
        (100 * MiB, 500 * MiB, 300 * MiB, True),
        (100 * MiB, 400 * MiB, 300 * MiB, False),  # exactly the threshold is not a leak
        (100 * MiB, 50 * MiB, 0, False),
        (None, 500 * MiB, 0, False),
        (100 * MiB, None, 0, False),
    ],
)
def test_leaked(baseline: int | None, current: int | None, threshold: int, expected: bool) -> None:
    assert leaked(baseline, current, threshold) is expected


def test_module_exports_exist() -> None:
    assert all(hasattr(_memory, name) for name in _memory.__all__)
