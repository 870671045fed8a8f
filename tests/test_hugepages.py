"""The CLI restarts once with huge pages for large allocations where the kernel gives them only on request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.process import hugepages
from localspec.process.hugepages import (
    OPT_OUT,
    TUNABLE,
    glibc_version,
    thp_mode,
    tunables_with_huge_pages,
)

GLIBC = (2, 36)


def test_restart_where_the_kernel_gives_huge_pages_on_request() -> None:
    assert tunables_with_huge_pages({}, "madvise", "linux", GLIBC) == f"{TUNABLE}=1"


def test_other_tunables_are_kept() -> None:
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert tunables_with_huge_pages(env, "madvise", "linux", GLIBC) == f"glibc.malloc.arena_max=2:{TUNABLE}=1"


@pytest.mark.parametrize(
    ("env", "mode", "platform", "glibc"),
    [
        ({}, "always", "linux", GLIBC),  # every allocation gets them already
        ({}, "never", "linux", GLIBC),  # none can
        ({}, None, "linux", GLIBC),  # no THP in this kernel
        ({}, "madvise", "darwin", GLIBC),
        ({}, "madvise", "linux", None),  # musl and others: no such tunable
        ({}, "madvise", "linux", (2, 34)),  # the tunable came in 2.35
        ({OPT_OUT: "0"}, "madvise", "linux", GLIBC),
        ({"GLIBC_TUNABLES": f"{TUNABLE}=0"}, "madvise", "linux", GLIBC),  # the user's own choice
        ({"GLIBC_TUNABLES": f"{TUNABLE}=1"}, "madvise", "linux", GLIBC),  # restarted already
    ],
)
def test_no_restart(
    env: dict[str, str], mode: str | None, platform: str, glibc: tuple[int, int] | None
) -> None:
    assert tunables_with_huge_pages(env, mode, platform, glibc) is None


def test_huge_pages_reads_the_tunable_as_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(hugepages, "glibc_version", lambda: GLIBC)
    assert hugepages.huge_pages({"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{TUNABLE}=1"})
    assert not hugepages.huge_pages({"GLIBC_TUNABLES": f"{TUNABLE}=0"})
    assert not hugepages.huge_pages({})
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "always")  # every allocation has them
    assert hugepages.huge_pages({})


def test_thp_mode_reads_the_bracketed_choice(tmp_path: Path) -> None:
    enabled = tmp_path / "enabled"
    enabled.write_text("always [madvise] never\n")
    assert thp_mode(enabled) == "madvise"
    assert thp_mode(tmp_path / "missing") is None


# Run as `localspec` runs: restart first, then a large allocation, as llama.cpp's buffers are made.
CHILD = """
import ctypes, os, re
print("started", os.getpid(), flush=True)
from localspec.process.hugepages import restart_with_huge_pages, huge_pages
restart_with_huge_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
ctypes.memset(libc.malloc(size), 1, size)
rollup = open("/proc/self/smaps_rollup").read()
print("huge", re.search(r"AnonHugePages:\\s+(\\d+)", rollup).group(1), huge_pages(), flush=True)
"""


def _run_child(env: dict[str, str]) -> list[list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [line.split() for line in out.splitlines()]


needs_madvise = pytest.mark.skipif(
    not hugepages._on_request(thp_mode(), glibc_version()),
    reason="the kernel gives huge pages to every allocation or to none, or no glibc >= 2.35",
)


@needs_madvise
def test_the_restarted_process_gets_huge_pages() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT)}
    lines = _run_child(env)
    started = [line[1] for line in lines if line[0] == "started"]
    assert len(started) == 2 and started[0] == started[1]  # the same process, once more
    (huge,) = (line for line in lines if line[0] == "huge")
    assert int(huge[1]) > 0 and huge[2] == "True"


@needs_madvise
def test_opted_out_it_runs_on_without() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | {OPT_OUT: "0"}
    lines = _run_child(env)
    assert [line[0] for line in lines] == ["started", "huge"]
    assert lines[1][1:] == ["0", "False"]
