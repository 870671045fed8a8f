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
from dataclasses import dataclass
from pathlib import Path

from localspec.process.cgroup import folders, read

# Left available on the host beside the models, their saved caches and growing contexts: the OS, the
# person's other programs and this process need room, and none of these may push the machine to swap.
HOST_RESERVE = 1 << 30
# cgroup v1 writes "no limit" as the largest page-aligned 63-bit number.
V1_UNLIMITED = 1 << 62


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
    `root` and `self_cgroup` as process.cgroup.folders takes them."""
    found = [
        limit
        for version, folder in folders("memory", root, self_cgroup)
        if (limit := (_v2 if version == 2 else _v1)(folder)) is not None
    ]
    return min(found, key=lambda f: f[0] - f[1]) if found else None


def _v2(folder: Path) -> tuple[int, int] | None:
    text = read(folder / "memory.max")
    if text is None or text == "max":
        return None
    return _held(text, read(folder / "memory.current"), _stat(folder, "file"))


def _v1(folder: Path) -> tuple[int, int] | None:
    # memory.stat's hierarchical limit is the least of this cgroup's and its ancestors': the ones a
    # container cannot see.
    text = read(folder / "memory.limit_in_bytes")
    limits = [int(text)] if text is not None and text.isdigit() else []
    limits += [n for n in (_stat(folder, "hierarchical_memory_limit"),) if n]
    limit = min(limits, default=V1_UNLIMITED)
    if limit >= V1_UNLIMITED:
        return None
    return _held(str(limit), read(folder / "memory.usage_in_bytes"), _stat(folder, "total_cache"))


def _held(limit: str, usage: str | None, cache: int) -> tuple[int, int] | None:
    if not limit.isdigit() or usage is None or not usage.isdigit():
        return None
    return int(limit), max(0, int(usage) - cache)


def _stat(folder: Path, key: str) -> int:
    """One counter of the cgroup's memory.stat (0 where it is missing)."""
    text = read(folder / "memory.stat") or ""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


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
