"""Device memory: size parsing, the probes' parsers, overrides, and detection on this machine.

No GPU can be conjured here, so the GPU probes are fed fake figures: a fake `pynvml`
module and a fake `nvidia-smi` on PATH. Those figures are the only fakes.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import psutil
import pytest

from localspec.errors import UserInputError
from localspec.pickdraft.devices import (
    GIB,
    MIB,
    apple,
    apple_working_set,
    combine_gpus,
    cpu_only,
    detect_memory,
    parse_nvidia_smi,
    parse_size,
    with_overrides,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8G", 8 * GIB),
        ("24GiB", 24 * GIB),
        ("16GB", 16 * GIB),
        ("16 gb", 16 * GIB),
        ("512M", 512 * MIB),
        ("1.5G", 3 * GIB // 2),
        ("2T", 2048 * GIB),
        ("4096", 4096),
        ("0", 0),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "eight G", "8X", "-1G", "8 iB", "1e9"])
def test_parse_size_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(UserInputError, match="cannot read the size"):
        parse_size(text)


def test_parse_nvidia_smi() -> None:
    text = "NVIDIA GeForce RTX 4090, 24564, 23012\nNVIDIA A100-SXM4-80GB, 81920, [N/A]\n\n"
    assert parse_nvidia_smi(text) == [("NVIDIA GeForce RTX 4090", 24564 * MIB, 23012 * MIB)]


def test_several_gpus_make_one_budget() -> None:
    one = ("NVIDIA L4", 23034 * MIB, 22000 * MIB)
    assert combine_gpus([one]) == one
    assert combine_gpus([one, one]) == ("2x NVIDIA L4", 2 * one[1], 2 * one[2])


def test_apple_working_set_is_two_thirds_then_three_quarters() -> None:
    assert apple_working_set(16 * GIB) == int(16 * GIB * 2 / 3)
    assert apple_working_set(64 * GIB) == 48 * GIB
    mac = apple(16 * GIB)
    assert mac.unified and mac.has_gpu and mac.kind == "metal"
    assert mac.gpu_free == int(16 * GIB * 2 / 3) and mac.ram_total == 16 * GIB
    # A raised wired limit (sysctl iogpu.wired_limit_mb) replaces the default share.
    assert apple(16 * GIB, wired_limit=14 * GIB).gpu_free == 14 * GIB


def test_overrides() -> None:
    here = cpu_only(32 * GIB, 20 * GIB)
    planned = with_overrides(here, vram=24 * GIB, ram=None)
    assert planned.has_gpu and (planned.gpu_total, planned.gpu_free) == (24 * GIB, 24 * GIB)
    assert planned.ram_available == 20 * GIB and "--vram" in planned.source
    smaller = with_overrides(here, vram=None, ram=16 * GIB)
    assert (smaller.ram_total, smaller.ram_available, smaller.has_gpu) == (16 * GIB, 16 * GIB, False)
    # --vram 0 plans for the CPU even on a machine with a GPU.
    gpu = with_overrides(here, vram=8 * GIB, ram=None)
    assert not with_overrides(gpu, vram=0, ram=None).has_gpu
    # On unified memory, --ram moves the Metal working set with it.
    mac = with_overrides(apple(64 * GIB), vram=None, ram=16 * GIB)
    assert mac.gpu_free == int(16 * GIB * 2 / 3)


def test_describe_names_the_numbers() -> None:
    assert cpu_only(16 * GIB).describe() == "CPU only; RAM 16.0 of 16.0 GiB available (psutil)"
    line = with_overrides(cpu_only(16 * GIB), vram=8 * GIB, ram=None).describe()
    assert "GPU 8.0 of 8.0 GiB free" in line


def test_detect_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: import fails as when not installed
    monkeypatch.setenv("PATH", "/nonexistent")
    found = detect_memory()
    assert found.kind == ("metal" if sys.platform == "darwin" else "cpu")
    assert found.ram_total == psutil.virtual_memory().total
    assert 0 < found.ram_available <= found.ram_total
    assert detect_memory(vram=12 * GIB).gpu_free == 12 * GIB


def test_detect_through_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if sys.platform == "darwin":
        pytest.skip("Apple Silicon is probed through sysctl")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA GeForce RTX 3060, 12288, 11000'\n")
    smi.chmod(0o755)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = detect_memory()
    assert (found.kind, found.name, found.source) == ("cuda", "NVIDIA GeForce RTX 3060", "nvidia-smi")
    assert (found.gpu_total, found.gpu_free) == (12288 * MIB, 11000 * MIB)


def fake_pynvml(gpus: list[tuple[str, int, int]]) -> types.ModuleType:
    """The few NVML calls devices.py makes, answering with `gpus` (name, total, free)."""
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def memory(i: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=gpus[i][1], free=gpus[i][2], used=gpus[i][1] - gpus[i][2])

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = lambda: None  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda i: gpus[i][0].encode()  # type: ignore[attr-defined]
    return mod


def test_detect_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.platform == "darwin":
        pytest.skip("Apple Silicon is probed through sysctl")
    gpus = [("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB), ("NVIDIA H100 80GB HBM3", 80 * GIB, 60 * GIB)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    found = detect_memory()
    assert (found.kind, found.name, found.source) == ("cuda", "2x NVIDIA H100 80GB HBM3", "nvml")
    assert (found.gpu_total, found.gpu_free) == (160 * GIB, 139 * GIB)
