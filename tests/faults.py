"""Read-only and full folders for the fault tests, made the strongest way this machine allows.

As root, permission bits stop nothing, so a read-only folder is a read-only tmpfs and a
full disk a small tmpfs filled to the last byte. Without root, a read-only folder is a
0555 folder, and a full disk is a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored,
so a write past it fails with EFBIG as a full disk fails with ENOSPC) applied to the
daemon process alone. Each fixture says which it used in `how`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = os.geteuid() == 0
FSIZE_BYTES = 128 << 10


@dataclass
class Folder:
    path: Path
    how: str  # "tmpfs" or "chmod" / "rlimit"


def _mount(target: Path, options: str) -> bool:
    if not ROOT:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    return done.returncode == 0


def _umount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


@contextlib.contextmanager
def read_only_folder(base: Path) -> Iterator[Folder]:
    folder = base / "read-only"
    folder.mkdir()
    if _mount(folder, "ro,size=64k"):
        try:
            yield Folder(folder, "tmpfs")
        finally:
            _umount(folder)
        return
    if ROOT:
        pytest.skip("as root, a read-only folder needs a tmpfs mount, which this machine refuses")
    folder.chmod(0o555)
    try:
        yield Folder(folder, "chmod")
    finally:
        folder.chmod(0o755)


@contextlib.contextmanager
def full_folder(base: Path, how: str = "tmpfs") -> Iterator[Folder]:
    """A folder on a full disk (tmpfs, where it can be mounted), else (or for `how="rlimit"`) one
    whose writes fail past FSIZE_BYTES for a process that calls `limit_fsize`."""
    folder = base / "full"
    folder.mkdir()
    if how == "rlimit" or not _mount(folder, "size=256k"):
        yield Folder(folder, "rlimit")
        return
    try:
        with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        yield Folder(folder, "tmpfs")
    finally:
        _umount(folder)


def limit_fsize() -> None:
    """preexec_fn for a daemon on a "rlimit" full folder: writes past FSIZE_BYTES fail with EFBIG."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_BYTES, FSIZE_BYTES))
