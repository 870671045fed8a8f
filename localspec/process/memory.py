"""The RAM this process may still take: the machine's, within its cgroup's memory limit.

psutil reads the machine's /proc/meminfo. In a container given 4 GiB of a 64 GiB host it sees 64,
and a model planned to that is killed by the kernel when it passes the container's limit (the OOM
killer, no error to read). So the limit of this process's cgroup, and of each cgroup above it, caps
what a plan, a saved prompt cache or a growing context may count on: cgroup v2's `memory.max`
(Docker, Podman, systemd), v1's `memory.limit_in_bytes` otherwise. What a cgroup holds in page
cache is counted free, as the machine's MemAvailable counts it (the kernel drops it under the
limit before it kills); the model files this process maps are page cache too, but in use:
`mapped_file_bytes` says how much of them a caller should leave out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
# Left available on the host beside the models, their saved caches and growing contexts: the OS, the
# person's other programs and this process need room, and none of these may push the machine to swap.
HOST_RESERVE = 1 << 30
# cgroup v1 writes "no limit" as the largest page-aligned 63-bit number.
V1_UNLIMITED = 1 << 62
# Reads one cgroup folder: (limit, held), or None where it sets no limit.
_Reader = Callable[[Path], "tuple[int, int] | None"]


@dataclass(frozen=True)
class Ram:
    """Bytes of RAM: in all, and what could be handed out now without swapping."""

    total: int
    available: int
    # The cgroup limit that caps them, where one does (for the line that says where figures come from).
    limit: int | None = None


def ram() -> Ram:
    """The machine's RAM within this process's cgroup limit."""
    import psutil

    vm = psutil.virtual_memory()
    return within_limit(Ram(int(vm.total), int(vm.available)), cgroup_headroom())


def room_for(size: int) -> bool:
    """Whether `size` more bytes leave HOST_RESERVE available (within the cgroup limit), the model
    files this process maps counted as in use."""
    return ram().available - mapped_file_bytes() - size >= HOST_RESERVE


def within_limit(machine: Ram, cgroup: tuple[int, int] | None) -> Ram:
    """`machine` capped by a cgroup's (limit, bytes it holds that cannot be reclaimed)."""
    if cgroup is None or cgroup[0] >= machine.total:
        return machine
    limit, held = cgroup
    return Ram(limit, max(0, min(machine.available, limit - held)), limit)


def cgroup_headroom(root: Path | None = None, self_cgroup: Path | None = None) -> tuple[int, int] | None:
    """(limit, bytes held less page cache) of the cgroup, this process's or one above it, with the
    least room left under its memory limit; None where none has a limit or none can be read.
    `root` is where cgroups are mounted and `self_cgroup` the file naming this process's."""
    root = root or CGROUP_ROOT
    self_cgroup = self_cgroup or SELF_CGROUP
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[tuple[int, int]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # cgroup v2's single hierarchy
            found += _limits(_own(root, parts[2]), root, _v2)
        elif "memory" in parts[1].split(","):
            found += _limits(_own(root / "memory", parts[2]), root / "memory", _v1)
    return min(found, key=lambda f: f[0] - f[1]) if found else None


def _own(mount: Path, relative: str) -> Path:
    """The cgroup's folder: its path under the mount, or the mount itself where a cgroup namespace
    (a container's usual view) shows the process's own cgroup as the root."""
    own = mount / relative.lstrip("/")
    return own if own.is_dir() else mount


def _limits(folder: Path, mount: Path, read: _Reader) -> list[tuple[int, int]]:
    """(limit, held) of `folder` and each cgroup above it up to the mount that sets a limit."""
    out = []
    while True:
        limit = read(folder)
        if limit is not None:
            out.append(limit)
        if folder == mount or mount not in folder.parents:
            return out
        folder = folder.parent


def _v2(folder: Path) -> tuple[int, int] | None:
    text = _read(folder / "memory.max")
    if text is None or text == "max":
        return None
    return _held(text, _read(folder / "memory.current"), _stat(folder, "file"))


def _v1(folder: Path) -> tuple[int, int] | None:
    # memory.stat's hierarchical limit is the least of this cgroup's and its ancestors': the ones a
    # container cannot see.
    text = _read(folder / "memory.limit_in_bytes")
    limits = [int(text)] if text is not None and text.isdigit() else []
    limits += [n for n in (_stat(folder, "hierarchical_memory_limit"),) if n]
    limit = min(limits, default=V1_UNLIMITED)
    if limit >= V1_UNLIMITED:
        return None
    return _held(str(limit), _read(folder / "memory.usage_in_bytes"), _stat(folder, "total_cache"))


def _held(limit: str, usage: str | None, cache: int) -> tuple[int, int] | None:
    if not limit.isdigit() or usage is None or not usage.isdigit():
        return None
    return int(limit), max(0, int(usage) - cache)


def _stat(folder: Path, key: str) -> int:
    """One counter of the cgroup's memory.stat (0 where it is missing)."""
    text = _read(folder / "memory.stat") or ""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def mapped_file_bytes() -> int:
    """This process's resident file-backed pages (RssFile; Linux only, 0 elsewhere).

    llama.cpp maps weights from their files; the kernel counts those pages as available (they could
    be dropped and read again), yet they are in use by the loaded models.
    """
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
