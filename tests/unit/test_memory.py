"""Claims about RSS sampling and OOM-kill evidence, against this process and fake cgroup trees."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from fastpool import _memory
from fastpool._memory import (
    MemorySample,
    OomEvidence,
    WorkerMemory,
    cgroup_of,
    judge_sigkill,
    leaked,
    limit_hit_count,
    oom_kill_count,
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


def hybrid(tmp_path: Path, v1_files: dict[str, str], v2_files: dict[str, str] | None = None) -> Path:
    files = {f"/sys/fs/cgroup/memory/pool/w1/{k}": v for k, v in v1_files.items()}
    files |= {f"/sys/fs/cgroup/unified/{k}": v for k, v in (v2_files or {}).items()}
    files.setdefault("/sys/fs/cgroup/unified/cgroup.procs", "")
    return make_root(tmp_path, 4242, "4:memory:/pool/w1\n0::/\n", HYBRID_MOUNTINFO, files)


def pure_v2(tmp_path: Path, files: dict[str, str]) -> Path:
    files = {f"/sys/fs/cgroup/app/{k}": v for k, v in files.items()}
    return make_root(tmp_path, 4242, "0::/app\n", V2_MOUNTINFO, files)


# --- rss_bytes -----------------------------------------------------------------


def test_rss_of_this_process_is_plausible_and_matches_psutil() -> None:
    rss = rss_bytes(os.getpid())
    assert rss is not None and rss > 5 * MiB  # an interpreter with numpy loaded
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)


def test_rss_grows_when_memory_is_touched() -> None:
    # A collection of earlier tests' garbage between the two readings could free a
    # large array and hide the growth: none runs there.
    gc.collect()
    gc.disable()
    try:
        before = rss_bytes(os.getpid())
        block = np.ones(64 * MiB // 8)  # np.ones writes every page, so they are resident
        after = rss_bytes(os.getpid())
    finally:
        gc.enable()
    assert before is not None and after is not None
    assert after - before >= 48 * MiB
    del block


@pytest.fixture
def without_statm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading off Linux: psutil, as where /proc/<pid>/statm does not exist."""
    monkeypatch.setattr(_memory, "_STATM", False)


@contextlib.contextmanager
def zombie() -> Iterator[int]:
    """The pid of a child that has exited and is not reaped yet."""
    child = subprocess.Popen(["true"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited; still a zombie
        yield child.pid
    finally:
        child.wait()


def test_rss_reads_statm_on_linux_and_matches_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _memory._STATM:
        pytest.skip("no /proc/<pid>/statm here")

    def no_psutil(pid: int) -> psutil.Process:
        raise AssertionError("psutil used where /proc/<pid>/statm is readable")

    monkeypatch.setattr(psutil, "Process", no_psutil)
    rss = rss_bytes(os.getpid())
    wm = WorkerMemory(worker_id=0, pid=os.getpid())
    sample = wm.sample(1.0)
    monkeypatch.undo()
    expected = psutil.Process().memory_info().rss
    assert rss == pytest.approx(expected, rel=0.2)
    assert sample is not None and sample.rss_bytes == pytest.approx(expected, rel=0.2)


def test_rss_of_a_zombie_is_none() -> None:
    if not _memory._STATM:
        pytest.skip("no /proc/<pid>/statm here")
    with zombie() as pid:
        assert Path(f"/proc/{pid}/statm").exists()  # still listed: only its pages are gone
        assert rss_bytes(pid) is None
        assert WorkerMemory(worker_id=0, pid=pid).sample(1.0) is None


@pytest.mark.parametrize(
    "exc", [psutil.NoSuchProcess(1), psutil.ZombieProcess(1), psutil.AccessDenied(1)]
)
def test_rss_of_a_gone_or_forbidden_process_is_none_off_linux(
    monkeypatch: pytest.MonkeyPatch, without_statm: None, exc: Exception
) -> None:
    def vanish(pid: int) -> psutil.Process:
        raise exc

    monkeypatch.setattr(psutil, "Process", vanish)
    assert rss_bytes(os.getpid()) is None
    assert WorkerMemory(worker_id=0, pid=os.getpid()).sample(1.0) is None


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
    assert "last RSS ?" in why and "no memory limit" in why


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
        before_count=1, after_count=2, last_rss_bytes=MiB, limit_bytes=None, sent_by_pool=False,
        scope="system",
    )
    confirmed, why = ev.judge()
    assert confirmed is True and "system OOM-kill counter" in why
    assert ev.judge() == judge_sigkill(1, 2, MiB, None, False, scope="system")


# --- WorkerMemory --------------------------------------------------------------


def test_worker_memory_tracks_current_peak_and_baseline() -> None:
    wm = WorkerMemory(worker_id=0, pid=123)
    assert wm.record(100, 1.0) == MemorySample(pid=123, rss_bytes=100, at=1.0)
    wm.record(300, 2.0)
    wm.record(200, 3.0)
    assert (wm.current_bytes, wm.peak_bytes, wm.baseline_bytes) == (200, 300, 100)
    assert (wm.samples, wm.last_at) == (3, 3.0)


def test_over_limit_compares_the_current_reading() -> None:
    wm = WorkerMemory(worker_id=0, pid=123)
    wm.record(500, 0.0)
    wm.record(100, 1.0)  # the peak of 500 is history
    assert wm.over_limit(None) is False
    assert wm.over_limit(100) is False  # at the limit is not over it
    assert wm.over_limit(99) is True
    assert wm.over_limit(200) is False


def test_sampling_this_process_records_its_rss() -> None:
    wm = WorkerMemory(worker_id=1, pid=os.getpid())
    first = wm.sample(10.0)
    assert first is not None and first.rss_bytes > 5 * MiB and first.at == 10.0
    assert wm.sample(11.0) is not None
    assert wm.samples == 2 and wm.peak_bytes >= wm.baseline_bytes  # type: ignore[operator]


def test_sampling_off_linux_keeps_the_process_handle(without_statm: None) -> None:
    wm = WorkerMemory(worker_id=1, pid=os.getpid())
    first = wm.sample(10.0)
    assert first is not None and first.rss_bytes > 5 * MiB and first.at == 10.0
    handle = wm._proc
    assert wm.sample(11.0) is not None
    assert wm._proc is handle
    assert wm.samples == 2 and wm.peak_bytes >= wm.baseline_bytes  # type: ignore[operator]


def test_sampling_a_gone_worker_returns_none_and_keeps_the_last_values() -> None:
    with zombie() as pid:
        wm = WorkerMemory(worker_id=2, pid=pid)
        wm.record(42 * MiB, 1.0)
        assert wm.sample(2.0) is None
        assert (wm.current_bytes, wm.samples, wm.last_at) == (42 * MiB, 1, 1.0)


def test_sampling_a_gone_worker_off_linux_returns_none_and_keeps_the_last_values(
    without_statm: None,
) -> None:
    wm = WorkerMemory(worker_id=2, pid=os.getpid())
    wm.record(42 * MiB, 1.0)

    class Gone:
        def memory_info(self) -> None:
            raise psutil.NoSuchProcess(wm.pid)

    wm._proc = Gone()  # type: ignore[assignment]
    assert wm.sample(2.0) is None
    assert (wm.current_bytes, wm.samples, wm.last_at) == (42 * MiB, 1, 1.0)


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
