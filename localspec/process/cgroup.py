"""This process's cgroups as the kernel shows them: the limits a container (Docker, Podman, systemd)
sets on the CPUs and the memory it may use, which psutil and os.cpu_count do not see.

/proc/self/cgroup names the process's cgroup in each hierarchy: `0::/path` on cgroup v2, and
`N:controller[,controller]:/path` for each of v1's controllers. Its folder is that path under the
mount (/sys/fs/cgroup, or /sys/fs/cgroup/<controllers> on v1), or the mount itself where a cgroup
namespace (a container's usual view) shows the process's own cgroup as the root. A limit set on a
cgroup above binds too, so readers look at each folder up to the mount.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def folders(
    controller: str, root: Path | None = None, self_cgroup: Path | None = None
) -> list[tuple[int, Path]]:
    """(cgroup version, folder) for this process's cgroup and each above it up to the mount, on the
    v2 hierarchy and on the v1 hierarchy of `controller` ("memory", "cpu"); none where unreadable.
    `root` is where cgroups are mounted and `self_cgroup` the file naming this process's."""
    root = root or CGROUP_ROOT
    try:
        lines = (self_cgroup or SELF_CGROUP).read_text().splitlines()
    except OSError:
        return []
    found: list[tuple[int, Path]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            found += [(2, folder) for folder in _up(root, parts[2])]
        elif controller in parts[1].split(","):
            mount = root / parts[1]  # "cpu,cpuacct"; most systems link "cpu" to it as well
            mount = mount if mount.is_dir() else root / controller
            found += [(1, folder) for folder in _up(mount, parts[2])]
    return found


def _up(mount: Path, relative: str) -> list[Path]:
    """The cgroup's folder and each above it up to `mount`."""
    folder = mount / relative.lstrip("/")
    if not folder.is_dir():
        return [mount]
    out = [folder]
    while folder != mount and mount in folder.parents:
        folder = folder.parent
        out.append(folder)
    return out


def read(path: Path) -> str | None:
    """A cgroup file's text, stripped; None where it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_quota(root: Path | None = None, self_cgroup: Path | None = None) -> int | None:
    """The CPUs the tightest CPU quota on this process's cgroups allows (v2's `cpu.max`, v1's
    `cpu.cfs_quota_us` over `cpu.cfs_period_us`), rounded up; None where none sets one."""
    quotas = []
    for version, folder in folders("cpu", root, self_cgroup):
        if version == 2:
            text = read(folder / "cpu.max")
        else:
            quota, period = read(folder / "cpu.cfs_quota_us"), read(folder / "cpu.cfs_period_us")
            text = f"{quota} {period}" if quota is not None and period is not None else None
        cpus = quota_cpus(text) if text is not None else None
        if cpus is not None:
            quotas.append(cpus)
    return min(quotas, default=None)


def quota_cpus(cpu_max: str) -> int | None:
    """The CPUs a quota ("200000 100000": 2 CPUs' time a period) allows, rounded up; None for no
    quota ("max" on v2, -1 on v1) or text that is not one."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return -(-quota // period) if quota > 0 and period > 0 else None
