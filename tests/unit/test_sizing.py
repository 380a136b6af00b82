"""Claims about CPU and memory sizing, mostly against fake /proc and cgroup trees under tmp_path."""

from __future__ import annotations

import math
import os
from pathlib import Path

import psutil
import pytest

from fastpool._supervision import _sizing
from fastpool._supervision._sizing import (
    BLAS_THREAD_VARS,
    AvailableMemory,
    available_memory_bytes,
    blas_thread_env,
    cgroup_memory_headroom_bytes,
    cpu_quota,
    default_workers,
    find_cgroups,
    meminfo_bytes,
    memory_limit_bytes,
    parse_memory,
    parse_mountinfo,
    parse_proc_cgroup,
    total_memory_bytes,
    usable_cpus,
)

MiB, GiB = 2**20, 2**30
V1_UNLIMITED = "9223372036854771712"  # what this machine's v1 memory.limit_in_bytes says

# This machine's layout: v1 controllers under /sys/fs/cgroup/<name>, v2 at .../unified.
HYBRID_MOUNTINFO = """\
25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/root rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:8 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
9:name=systemd:/
4:memory:/jobs/job1
1:cpu,cpuacct:/jobs/job1
0::/
"""
V2_MOUNTINFO = (
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
)
V2_CGROUP = "0::/user.slice/app\n"


def make_root(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> Path:
    """A fake filesystem root: /proc/self/{cgroup,mountinfo} plus ``files`` at absolute paths."""
    for rel, text in {
        "/proc/self/cgroup": cgroup,
        "/proc/self/mountinfo": mountinfo,
        **files,
    }.items():
        path = tmp_path / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def v2_root(tmp_path: Path, leaf: dict[str, str], parent: dict[str, str] | None = None) -> Path:
    files = {f"/sys/fs/cgroup/user.slice/app/{k}": v for k, v in leaf.items()}
    files |= {f"/sys/fs/cgroup/user.slice/{k}": v for k, v in (parent or {}).items()}
    files["/sys/fs/cgroup/cgroup.controllers"] = "cpu memory\n"
    return make_root(tmp_path, V2_CGROUP, V2_MOUNTINFO, files)


def v1_root(
    tmp_path: Path, cpu: dict[str, str] | None = None, memory: dict[str, str] | None = None
) -> Path:
    files = {f"/sys/fs/cgroup/cpu,cpuacct/jobs/job1/{k}": v for k, v in (cpu or {}).items()}
    files |= {f"/sys/fs/cgroup/memory/jobs/job1/{k}": v for k, v in (memory or {}).items()}
    files["/sys/fs/cgroup/unified/cgroup.procs"] = ""  # v2 tree with no controllers, as here
    return make_root(tmp_path, HYBRID_CGROUP, HYBRID_MOUNTINFO, files)


def affinity() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --- parsing -------------------------------------------------------------------


def test_parse_proc_cgroup_maps_each_controller_and_v2() -> None:
    parsed = parse_proc_cgroup(HYBRID_CGROUP + "7:blkio:/a:b:c\ngarbage\n")
    assert parsed["memory"] == "/jobs/job1"
    assert parsed["cpu"] == parsed["cpuacct"] == "/jobs/job1"
    assert parsed["name=systemd"] == "/"
    assert parsed[""] == "/"
    assert parsed["blkio"] == "/a:b:c"  # colons in the path survive


def test_parse_mountinfo_keeps_only_cgroup_mounts_and_reads_their_controllers() -> None:
    mounts = parse_mountinfo(HYBRID_MOUNTINFO + "garbage line\n")
    assert [m.fstype for m in mounts] == ["cgroup", "cgroup", "cgroup", "cgroup2"]
    cpu = mounts[0]
    assert cpu.mount_point == "/sys/fs/cgroup/cpu,cpuacct"  # despite the optional "shared:8"
    assert {"cpu", "cpuacct"} <= set(cpu.super_options)
    assert cpu.root == "/"


def test_parse_mountinfo_unescapes_spaces() -> None:
    (m,) = parse_mountinfo(r"41 31 0:38 /a\040b /sys/fs/my\040cg rw - cgroup2 cgroup2 rw" + "\n")
    assert (m.root, m.mount_point) == ("/a b", "/sys/fs/my cg")


# --- finding the cgroup --------------------------------------------------------


def test_find_cgroups_on_a_hybrid_host_gives_v2_then_v1(tmp_path: Path) -> None:
    root = v1_root(tmp_path, memory={"memory.limit_in_bytes": V1_UNLIMITED})
    v2, v1 = find_cgroups("memory", root=root)
    assert (v2.version, v2.path) == (2, root / "sys/fs/cgroup/unified")
    assert (v1.version, v1.path) == (1, root / "sys/fs/cgroup/memory/jobs/job1")
    assert v1.levels() == [
        root / "sys/fs/cgroup/memory/jobs/job1",
        root / "sys/fs/cgroup/memory/jobs",
        root / "sys/fs/cgroup/memory",
    ]


def test_find_cgroups_strips_a_container_mount_root(tmp_path: Path) -> None:
    # Docker without a cgroup namespace: /proc shows the host path, the mount shows that path as "/"
    mountinfo = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    root = make_root(
        tmp_path,
        "4:memory:/docker/abc\n",
        mountinfo,
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes": str(256 * MiB)},
    )
    (cg,) = find_cgroups("memory", root=root)
    assert cg.path == cg.mount == root / "sys/fs/cgroup/memory"
    assert memory_limit_bytes(root=root) == 256 * MiB


def test_find_cgroups_falls_back_to_the_mount_when_the_path_is_not_visible(tmp_path: Path) -> None:
    files = {"/sys/fs/cgroup/memory.max": "1000\n"}
    root = make_root(tmp_path, "0::/host/only/path\n", V2_MOUNTINFO, files)
    (cg,) = find_cgroups("memory", root=root)
    assert cg.path == root / "sys/fs/cgroup"
    assert memory_limit_bytes(root=root) == 1000


def test_find_cgroups_without_proc_is_empty(tmp_path: Path) -> None:
    assert find_cgroups("memory", root=tmp_path) == []
    assert cpu_quota(root=tmp_path) is None
    assert memory_limit_bytes(root=tmp_path) is None


def test_find_cgroups_skips_a_controller_no_hierarchy_carries(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    assert [cg.version for cg in find_cgroups("pids", root=root)] == [2]


# --- CPUs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cpu_max, expected",
    [
        ("150000 100000\n", 1.5),
        ("max 100000\n", None),
        ("50000 100000", 0.5),
        ("bogus", None),
        ("", None),
    ],
)
def test_cpu_quota_v2(tmp_path: Path, cpu_max: str, expected: float | None) -> None:
    assert cpu_quota(root=v2_root(tmp_path, {"cpu.max": cpu_max})) == expected


@pytest.mark.parametrize(
    "quota, period, expected",
    [("50000", "100000", 0.5), ("-1", "100000", None), ("400000", "100000", 4.0)],
)
def test_cpu_quota_v1(tmp_path: Path, quota: str, period: str, expected: float | None) -> None:
    root = v1_root(tmp_path, cpu={"cpu.cfs_quota_us": quota, "cpu.cfs_period_us": period})
    assert cpu_quota(root=root) == expected


def test_cpu_quota_of_a_parent_binds_a_child_that_says_max(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"cpu.max": "max 100000"}, parent={"cpu.max": "100000 100000"})
    assert cpu_quota(root=root) == 1.0


def test_cpu_quota_smallest_level_wins(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"cpu.max": "300000 100000"}, parent={"cpu.max": "800000 100000"})
    assert cpu_quota(root=root) == 3.0


@pytest.mark.parametrize(
    "cpu_max, cap",
    [("150000 100000", 2), ("50000 100000", 1), ("30000 100000", 1), ("1 100000", 1)],
)
def test_usable_cpus_is_the_ceiling_of_the_quota(tmp_path: Path, cpu_max: str, cap: int) -> None:
    assert usable_cpus(root=v2_root(tmp_path, {"cpu.max": cpu_max})) == min(affinity(), cap)


def test_usable_cpus_without_a_quota_is_the_affinity_mask(tmp_path: Path) -> None:
    assert usable_cpus(root=v2_root(tmp_path, {"cpu.max": "max 100000"})) == affinity()
    assert usable_cpus(root=v2_root(tmp_path, {"cpu.max": "100000000 100000"})) == affinity()


def test_usable_cpus_on_this_machine() -> None:
    n = usable_cpus()
    assert isinstance(n, int)
    assert 1 <= n <= (os.cpu_count() or 1)


# --- memory limits -------------------------------------------------------------


def test_memory_limit_v2(tmp_path: Path) -> None:
    assert memory_limit_bytes(root=v2_root(tmp_path, {"memory.max": f"{GiB}\n"})) == GiB


def test_memory_limit_v2_max_is_none(tmp_path: Path) -> None:
    assert memory_limit_bytes(root=v2_root(tmp_path, {"memory.max": "max\n"})) is None


def test_memory_limit_v2_parent_binds_child(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"memory.max": "max\n"}, parent={"memory.max": str(512 * MiB)})
    assert memory_limit_bytes(root=root) == 512 * MiB


def test_memory_limit_v1(tmp_path: Path) -> None:
    root = v1_root(tmp_path, memory={"memory.limit_in_bytes": str(512 * MiB)})
    assert memory_limit_bytes(root=root) == 512 * MiB


def test_memory_limit_v1_huge_value_means_no_limit(tmp_path: Path) -> None:
    root = v1_root(
        tmp_path,
        memory={
            "memory.limit_in_bytes": V1_UNLIMITED,
            "memory.stat": f"hierarchical_memory_limit {V1_UNLIMITED}\n",
        },
    )
    assert memory_limit_bytes(root=root) is None


def test_memory_limit_v1_hierarchical_limit_covers_hidden_ancestors(tmp_path: Path) -> None:
    root = v1_root(
        tmp_path,
        memory={
            "memory.limit_in_bytes": V1_UNLIMITED,
            "memory.stat": f"cache 0\nhierarchical_memory_limit {GiB}\n",
        },
    )
    assert memory_limit_bytes(root=root) == GiB


def test_memory_limit_on_this_machine_is_none_or_positive() -> None:
    limit = memory_limit_bytes()
    assert limit is None or (isinstance(limit, int) and limit > 0)


def test_headroom_v2_is_limit_minus_usage_net_of_inactive_cache(tmp_path: Path) -> None:
    root = v2_root(
        tmp_path,
        {
            "memory.max": str(GiB),
            "memory.current": str(300 * MiB),
            "memory.stat": f"anon 1\ninactive_file {100 * MiB}\n",
        },
    )
    assert cgroup_memory_headroom_bytes(root=root) == GiB - 200 * MiB


def test_headroom_v1(tmp_path: Path) -> None:
    root = v1_root(
        tmp_path,
        memory={
            "memory.limit_in_bytes": str(GiB),
            "memory.usage_in_bytes": str(400 * MiB),
            "memory.stat": f"total_inactive_file {100 * MiB}\n",
        },
    )
    assert cgroup_memory_headroom_bytes(root=root) == GiB - 300 * MiB


def test_headroom_is_the_tightest_level_and_never_negative(tmp_path: Path) -> None:
    root = v2_root(
        tmp_path,
        {"memory.max": str(GiB), "memory.current": str(100 * MiB)},
        parent={"memory.max": str(2 * GiB), "memory.current": str(3 * GiB)},
    )
    assert cgroup_memory_headroom_bytes(root=root) == 0


def test_headroom_without_a_limit_is_none(tmp_path: Path) -> None:
    assert cgroup_memory_headroom_bytes(root=v2_root(tmp_path, {"memory.max": "max"})) is None


def test_available_memory_is_capped_by_cgroup_headroom(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"memory.max": str(64 * MiB), "memory.current": str(16 * MiB)})
    assert available_memory_bytes(root=root) == min(48 * MiB, psutil.virtual_memory().available)


def test_available_memory_without_limit_is_psutils(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"memory.max": "max"})
    got = available_memory_bytes(root=root)
    assert got == pytest.approx(psutil.virtual_memory().available, rel=0.05)


def test_total_memory_is_the_smaller_of_limit_and_ram(tmp_path: Path) -> None:
    ram = psutil.virtual_memory().total
    assert total_memory_bytes(root=v2_root(tmp_path, {"memory.max": str(GiB)})) == min(GiB, ram)
    assert total_memory_bytes(root=v2_root(tmp_path, {"memory.max": str(ram * 4)})) == ram


def test_real_machine_memory_figures_are_sane() -> None:
    total, available = total_memory_bytes(), available_memory_bytes()
    assert 0 < available <= total <= psutil.virtual_memory().total


MEMINFO = "MemTotal:       24555244 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


def with_meminfo(root: Path, text: str) -> Path:
    (root / "proc" / "meminfo").write_text(text)
    return root


def test_meminfo_fields_are_read_in_bytes(tmp_path: Path) -> None:
    root = with_meminfo(v2_root(tmp_path, {}), MEMINFO)
    assert meminfo_bytes("MemTotal", root) == 24555244 * 1024
    assert meminfo_bytes("MemAvailable", root) == 20000000 * 1024
    assert meminfo_bytes("Mem", root) is None  # a prefix of a key is not the key
    assert meminfo_bytes("MemTotal", tmp_path / "elsewhere") is None


def test_memory_figures_come_from_meminfo_without_psutil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_psutil() -> None:
        raise AssertionError("psutil used where /proc/meminfo is readable")

    monkeypatch.setattr(psutil, "virtual_memory", no_psutil)
    free = with_meminfo(v2_root(tmp_path / "free", {"memory.max": "max"}), MEMINFO)
    assert total_memory_bytes(root=free) == 24555244 * 1024
    assert available_memory_bytes(root=free) == 20000000 * 1024
    limited = with_meminfo(
        v2_root(tmp_path / "limited", {"memory.max": str(GiB), "memory.current": str(GiB // 4)}),
        MEMINFO,
    )
    assert total_memory_bytes(root=limited) == GiB
    assert available_memory_bytes(root=limited) == GiB - GiB // 4


def test_the_supervisors_reading_finds_the_limited_levels_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every memory_interval_s the supervisor asks for available memory: usage and
    # MemAvailable are read each time, the levels with a limit only every RESOLVE_S
    # (finding them reads the mount table, our cgroup and every level's limit).
    leaf = tmp_path / "sys/fs/cgroup/user.slice/app"
    root = with_meminfo(
        v2_root(tmp_path, {"memory.max": str(GiB), "memory.current": str(GiB // 4)}), MEMINFO
    )
    clock = [100.0]
    monkeypatch.setattr(_sizing.time, "monotonic", lambda: clock[0])
    reading = AvailableMemory(root)
    assert reading() == GiB - GiB // 4
    (leaf / "memory.current").write_text(str(GiB // 2))
    (leaf / "memory.max").write_text("max")
    assert reading() == GiB - GiB // 2  # usage now; the limit as found a moment ago
    clock[0] += AvailableMemory.RESOLVE_S
    assert reading() == 20000000 * 1024  # the limit is gone: MemAvailable alone
    (leaf / "memory.max").write_text(str(2 * GiB))
    assert reading() == 20000000 * 1024
    clock[0] += AvailableMemory.RESOLVE_S
    assert reading() == 2 * GiB - GiB // 2  # a limit set while the pool runs


def test_a_kernel_without_memavailable_falls_back_to_psutil(tmp_path: Path) -> None:
    root = with_meminfo(
        v2_root(tmp_path, {"memory.max": "max"}), "MemTotal:  2048 kB\nMemFree:  1024 kB\n"
    )
    assert total_memory_bytes(root=root) == 2048 * 1024
    assert available_memory_bytes(root=root) == pytest.approx(
        psutil.virtual_memory().available, rel=0.05
    )


def test_this_machines_meminfo_is_what_psutil_reports() -> None:
    if meminfo_bytes("MemTotal") is None:
        pytest.skip("no /proc/meminfo here")
    assert meminfo_bytes("MemTotal") == psutil.virtual_memory().total
    assert meminfo_bytes("MemAvailable") == pytest.approx(
        psutil.virtual_memory().available, rel=0.05
    )


# --- parse_memory --------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GB", 2 * 10**9),
        ("512MiB", 512 * MiB),
        ("1.5 G", 3 * GiB // 2),
        ("100k", 100 * 1024),  # bare K is binary
        ("100kB", 100_000),  # kB is SI
        ("100KB", 100_000),  # case-insensitive
        ("2.3MB", 2_300_000),  # exact, no float rounding down
        ("1Gi", GiB),
        ("  3 mib ", 3 * MiB),
        ("4096", 4096),
        ("7b", 7),
        (".5K", 512),
        ("1TB", 10**12),
        ("2T", 2 * 2**40),
    ],
)
def test_parse_memory_strings(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


def test_check_memory_keeps_a_fraction_until_memory_bytes_resolves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = v2_root(tmp_path, {"memory.max": str(2 * 2**30)})

    def unread(*args: object, **kwargs: object) -> int:
        raise AssertionError("check_memory read this process's memory")

    with monkeypatch.context() as m:
        m.setattr(_sizing, "total_memory_bytes", unread)
        assert _sizing.check_memory(0.25) == 0.25
        assert _sizing.check_memory("1KiB") == 1024
    assert _sizing.memory_bytes(0.25, root=root) == _sizing.total_memory_bytes(root) // 4
    assert _sizing.memory_bytes(4096, root=root) == 4096


def test_parse_memory_int_is_bytes() -> None:
    assert parse_memory(4096) == 4096
    assert parse_memory(1) == 1  # the int 1 is a byte, unlike the float 1.0


def test_parse_memory_fraction_is_of_this_process_memory(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"memory.max": str(GiB)})
    limit = min(GiB, psutil.virtual_memory().total)
    assert parse_memory(0.5, root=root) == limit // 2
    assert parse_memory(1.0, root=root) == limit


@pytest.mark.parametrize(
    "bad",
    [
        "2 GBs",
        "abc",
        "",
        "-1GB",
        "0",
        "0.1",
        "1e9",
        "1.5.2G",
        0,
        -5,
        0.0,
        1.5,
        -0.5,
        math.nan,
        math.inf,
    ],
)
def test_parse_memory_refuses_with_advice(bad: object) -> None:
    with pytest.raises(ValueError, match="KiB/MiB/GiB"):
        parse_memory(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, None, b"1G", [1]])
def test_parse_memory_refuses_other_types(bad: object) -> None:
    with pytest.raises(TypeError, match="int, float or str"):
        parse_memory(bad)  # type: ignore[arg-type]


def test_parse_memory_big_float_names_the_int_spelling() -> None:
    with pytest.raises(ValueError, match=r"int\(2000000000.0\)"):
        parse_memory(2e9)


# --- default_workers and BLAS threads ------------------------------------------


def test_default_workers_without_budget_is_usable_cpus() -> None:
    assert default_workers() == usable_cpus()


def test_default_workers_follows_the_cpu_quota(tmp_path: Path) -> None:
    assert default_workers(root=v2_root(tmp_path, {"cpu.max": "100000 100000"})) == 1


def test_default_workers_is_capped_by_memory_budget(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"memory.max": str(GiB)})
    cpus = usable_cpus(root=root)
    assert default_workers(256 * MiB, root=root) == min(cpus, 4)
    assert default_workers("600MiB", root=root) == 1  # 1 GiB holds one 600 MiB worker


def test_default_workers_is_at_least_one_even_when_one_does_not_fit(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"memory.max": str(GiB)})
    assert default_workers("2GiB", root=root) == 1


def test_default_workers_refuses_a_bad_budget() -> None:
    with pytest.raises(ValueError):
        default_workers("lots")


def test_blas_threads_split_the_cpus_between_workers(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"cpu.max": "max 100000"})
    cpus = usable_cpus(root=root)
    env = blas_thread_env(1, environ={}, root=root)
    assert set(env) == set(BLAS_THREAD_VARS)
    assert set(env.values()) == {str(cpus)}
    assert set(blas_thread_env(cpus * 10, environ={}, root=root).values()) == {"1"}


def test_blas_threads_follow_the_cgroup_quota(tmp_path: Path) -> None:
    root = v2_root(tmp_path, {"cpu.max": "100000 100000"})
    assert set(blas_thread_env(1, environ={}, root=root).values()) == {"1"}


def test_threads_per_worker_reads_no_cgroup_file_with_a_cpu_or_less_per_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sizing, "_affinity_cpus", lambda: 4)

    def unread(*args: object, **kwargs: object) -> int:
        raise AssertionError("usable_cpus() read the cgroup files")

    with monkeypatch.context() as m:
        m.setattr(_sizing, "usable_cpus", unread)
        assert _sizing.threads_per_worker(3) == 1
        assert _sizing.threads_per_worker(4) == 1
        assert _sizing.threads_per_worker(9) == 1
    root = v2_root(tmp_path, {"cpu.max": "300000 100000"})  # a quota of 3 CPUs
    assert _sizing.threads_per_worker(1, root) == 3
    assert _sizing.threads_per_worker(2, root) == 1


def test_blas_threads_leave_a_user_setting_alone() -> None:
    env = blas_thread_env(1, environ={"OMP_NUM_THREADS": "7", "UNRELATED": "x"})
    assert "OMP_NUM_THREADS" not in env
    assert set(env) == set(BLAS_THREAD_VARS) - {"OMP_NUM_THREADS"}


def test_blas_threads_read_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BLAS_THREAD_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    assert set(blas_thread_env(1)) == set(BLAS_THREAD_VARS) - {"MKL_NUM_THREADS"}


def test_blas_threads_refuse_zero_workers() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        blas_thread_env(0)


def test_module_exports_exist() -> None:
    assert all(hasattr(_sizing, name) for name in _sizing.__all__)


def test_find_cgroups_parses_the_mount_table_once_and_follows_a_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisor resolves cgroups every memory_interval_s: the mount table is parsed
    # once for the same texts, and a process moved to another cgroup is found there.
    import fastpool._supervision._sizing as sizing

    files = {
        "/sys/fs/cgroup/memory/jobs/job1/memory.limit_in_bytes": str(256 * MiB),
        "/sys/fs/cgroup/memory/jobs/job2/memory.limit_in_bytes": str(128 * MiB),
    }
    root = make_root(tmp_path, HYBRID_CGROUP, HYBRID_MOUNTINFO, files)
    parses = []
    real = sizing.parse_mountinfo
    monkeypatch.setattr(sizing, "parse_mountinfo", lambda text: parses.append(1) or real(text))
    for _ in range(3):
        assert memory_limit_bytes(root=root) == 256 * MiB
    assert len(parses) == 1
    (root / "proc/self/cgroup").write_text(HYBRID_CGROUP.replace("job1", "job2"))
    assert memory_limit_bytes(root=root) == 128 * MiB
    assert len(parses) == 2
