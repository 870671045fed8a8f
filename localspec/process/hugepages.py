"""Transparent huge pages for the weights llama.cpp copies into memory: the CLI restarts once with them.

Decoding streams every weight once per token. llama.cpp's repacked weights, its KV cache and its
compute buffers are plain heap memory (posix_memalign), mapped in 4 KiB pages wherever the kernel
gives transparent huge pages only to memory that asks for them (`madvise`, as Ubuntu's kernels and
many VMs' are set): a 1.5B model's 800 MiB of repacked weights then span some 200,000 pages, every
one of them read each token. glibc asks for huge pages for its large allocations when started
with the tunable `glibc.malloc.hugetlb=1`, and a tunable is read only when a process starts. So
`localspec`, when started without it where it helps, replaces itself (exec, the same pid and
arguments) with a copy started with it, before anything is loaded. Measured on 2 vCPUs of a
Xeon with AMX: the 1.5B decodes 12% faster (docs/benchmarks.md, session 23); llama-server gains
the same when started so, which its users rarely do.

Not where the kernel already backs all memory with huge pages (`always`) or never does (`never`),
not off Linux or glibc (older glibc ignores the tunable), and not with LOCALSPEC_HUGE_PAGES=0.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("localspec.process")

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "LOCALSPEC_HUGE_PAGES"
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The kernel's transparent huge page mode (always, madvise, never); None where it has none."""
    try:
        found = re.search(r"\[(\w+)\]", path.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError):
        return None
    return found.group(1) if found else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library's glibc; None for another C library."""
    try:
        found = re.fullmatch(r"glibc (\d+)\.(\d+).*", os.confstr("CS_GNU_LIBC_VERSION") or "")
    except (ValueError, OSError):
        return None
    return (int(found.group(1)), int(found.group(2))) if found else None


MIN_GLIBC = (2, 35)  # the first glibc that reads the tunable


def _on_request(mode: str | None, glibc: tuple[int, int] | None) -> bool:
    """Whether the kernel gives huge pages only on request and this glibc can be told to ask."""
    return mode == "madvise" and glibc is not None and glibc >= MIN_GLIBC


def asking_for_huge_pages(tunables: str) -> str:
    """GLIBC_TUNABLES `tunables` with glibc told to ask for huge pages (replacing any say of its own)."""
    kept = [t for t in tunables.split(":") if t and not t.startswith(TUNABLE)]
    return ":".join([*kept, f"{TUNABLE}=1"])


def tunables_with_huge_pages(
    environ: Mapping[str, str], mode: str | None, platform: str, glibc: tuple[int, int] | None
) -> str | None:
    """The GLIBC_TUNABLES to restart with so that large allocations ask for huge pages; None: no restart."""
    if platform != "linux" or not _on_request(mode, glibc):
        return None
    if environ.get(OPT_OUT, "").strip().lower() in ("0", "false", "no", "off"):
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if TUNABLE in current:  # set by the user (either way), or by our own restart
        return None
    return asking_for_huge_pages(current)


def restart_with_huge_pages() -> None:
    """Replace this process with one started with huge pages for large allocations, where that helps.

    Returns only where no restart is needed or exec failed (then it runs on as it is).
    """
    tunables = tunables_with_huge_pages(os.environ, thp_mode(), sys.platform, glibc_version())
    if tunables is None or not sys.orig_argv or not sys.executable:
        return
    try:
        os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": tunables})
    except OSError as exc:  # e.g. the interpreter was replaced underneath us: run on without
        log.debug("could not restart with huge pages: %s", exc)


def huge_pages(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the large allocations of a process started with `environ` (default: this one's) are
    backed by transparent huge pages."""
    mode = thp_mode()
    if mode == "always":
        return True
    tunables = (os.environ if environ is None else environ).get("GLIBC_TUNABLES", "")
    return f"{TUNABLE}=1" in tunables.split(":") and _on_request(mode, glibc_version())
