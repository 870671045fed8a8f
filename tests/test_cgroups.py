"""A container's limits on memory and CPUs bind what plans and thread counts count on: cgroup
folders as the kernel lays them out.

No cgroup limit can be set on this machine without privileges, so the cgroup files are written to
a folder laid out as /sys/fs/cgroup is (v2, and v1's controllers) and read from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.pickdraft import devices
from localspec.process import cgroup
from localspec.process.cgroup import cpu_quota, quota_cpus
from localspec.process.memory import Ram, cgroup_headroom, within_limit

GIB = 1 << 30
MIB = 1 << 20


def v2_cgroup(folder: Path, limit: str, current: int, file_cache: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.max").write_text(f"{limit}\n")
    (folder / "memory.current").write_text(f"{current}\n")
    (folder / "memory.stat").write_text(f"anon {current - file_cache}\nfile {file_cache}\nkernel 4096\n")


def self_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "self-cgroup"
    path.write_text(text)
    return path


def test_v2_in_a_cgroup_namespace_reads_the_root_and_counts_page_cache_free(tmp_path: Path) -> None:
    # Docker on cgroup v2: the process sees its own cgroup as the mount's root, named "/".
    root = tmp_path / "cgroup"
    v2_cgroup(root, str(4 * GIB), current=3 * GIB, file_cache=2 * GIB)
    assert cgroup_headroom(root, self_file(tmp_path, "0::/\n")) == (4 * GIB, 1 * GIB)


def test_v2_takes_the_tightest_limit_on_the_way_up(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    v2_cgroup(root / "machine.slice", str(8 * GIB), current=7 * GIB)  # 1 GiB left
    v2_cgroup(root / "machine.slice" / "box.scope", str(6 * GIB), current=2 * GIB)  # 4 left
    found = cgroup_headroom(root, self_file(tmp_path, "0::/machine.slice/box.scope\n"))
    assert found == (8 * GIB, 7 * GIB)


def test_no_limit_anywhere_is_none(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    v2_cgroup(root / "user.slice", "max", current=5 * GIB)
    assert cgroup_headroom(root, self_file(tmp_path, "0::/user.slice\n")) is None
    assert cgroup_headroom(root, tmp_path / "missing") is None


def test_v1_memory_controller(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    folder = root / "memory" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "memory.limit_in_bytes").write_text(f"{2 * GIB}\n")
    (folder / "memory.usage_in_bytes").write_text(f"{1536 * MIB}\n")
    (folder / "memory.stat").write_text(f"cache {100 * MIB}\ntotal_cache {512 * MIB}\n")
    # v1 writes "unlimited" as a huge number: the parent's sets none.
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{20 * GIB}\n")
    lines = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    assert cgroup_headroom(root, self_file(tmp_path, lines)) == (2 * GIB, 1 * GIB)
    # A container sees its own cgroup as the root; a lower limit above it shows in memory.stat only.
    mount = tmp_path / "namespaced"
    (mount / "memory").mkdir(parents=True)
    (mount / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (mount / "memory" / "memory.usage_in_bytes").write_text(f"{1 * GIB}\n")
    (mount / "memory" / "memory.stat").write_text(f"total_cache 0\nhierarchical_memory_limit {3 * GIB}\n")
    assert cgroup_headroom(mount, self_file(tmp_path, "4:memory:/docker/abc\n")) == (3 * GIB, 1 * GIB)


def test_unreadable_counters_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(f"{GIB}\n")  # no memory.current beside it
    assert cgroup_headroom(root, self_file(tmp_path, "0::/\n")) is None


def test_within_limit_caps_total_and_available() -> None:
    machine = Ram(64 * GIB, 60 * GIB)
    assert within_limit(machine, None) == machine
    assert within_limit(machine, (128 * GIB, 0)) == machine  # a limit above the machine changes nothing
    assert within_limit(machine, (4 * GIB, 3 * GIB)) == Ram(4 * GIB, 1 * GIB, 4 * GIB)
    assert within_limit(machine, (4 * GIB, 5 * GIB)).available == 0
    assert within_limit(Ram(64 * GIB, 2 * GIB), (8 * GIB, 1 * GIB)).available == 2 * GIB


def test_the_plans_probe_sees_the_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cgroup"
    v2_cgroup(root, str(3 * GIB), current=1 * GIB)
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroup, "SELF_CGROUP", self_file(tmp_path, "0::/\n"))
    monkeypatch.setattr(devices, "_probe_gpu", lambda total, available: devices.cpu_only(total, available))
    found = devices.detect_memory()
    assert (found.ram_total, found.ram_available) == (3 * GIB, 2 * GIB)
    assert "cgroup limit 3.0 GiB" in found.describe()
    # --ram still replaces what was probed.
    assert devices.detect_memory(ram=16 * GIB).ram_available == 16 * GIB


def test_a_cpu_quota_is_read_as_whole_cpus() -> None:
    assert quota_cpus("200000 100000\n") == 2
    assert quota_cpus("150000 100000") == 2  # a part of a CPU more still runs a thread
    assert quota_cpus("50000 100000") == 1
    assert quota_cpus("max 100000") is None and quota_cpus("-1 100000") is None  # v2's and v1's "none"
    assert quota_cpus("") is None and quota_cpus("lots 100000") is None and quota_cpus("0 100000") is None


def test_cpu_quotas_on_v2_and_v1_the_tightest_on_the_way_up(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "machine.slice" / "box.scope").mkdir(parents=True)
    (root / "machine.slice" / "cpu.max").write_text("300000 100000\n")
    (root / "machine.slice" / "box.scope" / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(root, self_file(tmp_path, "0::/machine.slice/box.scope\n")) == 3
    # Docker on a cgroup v1 host, `--cpus 2`: the controllers' folder is "cpu,cpuacct".
    v1 = root / "cpu,cpuacct" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(root, self_file(tmp_path, "3:cpu,cpuacct:/docker/abc\n")) == 2
    both = "3:cpu,cpuacct:/docker/abc\n0::/machine.slice/box.scope\n"
    assert cpu_quota(root, self_file(tmp_path, both)) == 2
    assert (
        cpu_quota(root, self_file(tmp_path, "0::/user.slice\n")) is None
    )  # no such folder, none at the root
