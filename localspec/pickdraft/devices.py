"""How much memory this machine offers a model: one accelerator's, and the system's RAM.

Probes, most specific first: NVIDIA through NVML (the `nvidia-ml-py` package,
imported only here) or, without it, `nvidia-smi`; Apple Silicon through
`sysctl` (unified memory, of which Metal lets one process wire only its
"recommended working set"); RAM through psutil, within this process's cgroup memory
limit (process.memory: a container's). `--vram SIZE` and `--ram SIZE`
replace what the probes found, to plan for another machine (and in tests, the one
place where fake figures are right: no GPU can be conjured here).
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Literal

from localspec.errors import UserInputError

GIB = 1 << 30
MIB = 1 << 20
DeviceKind = Literal["cuda", "metal", "gpu", "cpu"]

# Metal's recommendedMaxWorkingSetSize is about two thirds of RAM on Macs up to
# 36 GB and three quarters above (what llama.cpp logs as "recommendedMaxWorkingSetSize").
APPLE_SMALL_RAM = 36 * GIB
APPLE_SMALL_SHARE = 2 / 3
APPLE_LARGE_SHARE = 3 / 4
_PROBE_TIMEOUT_S = 5.0

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class DeviceMemory:
    """Memory a plan may use, in bytes. gpu_* are 0 without an accelerator.

    `gpu_free` is what one process may still fill on the accelerator now;
    `ram_available` what the OS could hand out without swapping. On Apple Silicon
    (`unified`) both are the same RAM, so a plan must fit the two together.
    """

    kind: DeviceKind
    name: str
    gpu_total: int
    gpu_free: int
    ram_total: int
    ram_available: int
    unified: bool = False
    source: str = "psutil"

    @property
    def has_gpu(self) -> bool:
        return self.kind != "cpu" and self.gpu_free > 0

    def describe(self) -> str:
        """One line for people: 'NVIDIA RTX 4090: 22.1 of 24.0 GiB free; RAM 60.2 of 64.0 GiB'."""
        ram = f"RAM {self.ram_available / GIB:.1f} of {self.ram_total / GIB:.1f} GiB available"
        if not self.has_gpu:
            return f"CPU only; {ram} ({self.source})"
        what = "unified memory, Metal working set" if self.unified else "GPU"
        gpu = f"{self.name}: {what} {self.gpu_free / GIB:.1f} of {self.gpu_total / GIB:.1f} GiB free"
        return f"{gpu}; {ram} ({self.source})"


def parse_size(text: str) -> int:
    """Bytes in '8G', '24GiB', '16GB', '512M' or '1.5T'.

    Memory is counted in binary units even where it is labelled GB (a "24 GB" card
    has 24 GiB), so G, GB and GiB all mean 2**30 here; a bare number is bytes.
    """
    match = _SIZE.match(text)
    if not match or (match.group(3).lower().startswith("i") and not match.group(2)):
        raise UserInputError(f"cannot read the size {text!r}; write it like 8G, 24GiB or 16GB")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * _UNITS[unit])


def detect_memory(vram: int | None = None, ram: int | None = None) -> DeviceMemory:
    """Probe this machine, then apply the overrides (`vram` 0 plans for CPU only). RAM is the
    machine's within this process's cgroup memory limit (a container's), where one is set."""
    from localspec.process.memory import ram as probe_ram

    machine = probe_ram()
    found = _probe_gpu(machine.total, machine.available)
    if machine.limit is not None:
        found = replace(found, source=_with(found.source, f"cgroup limit {machine.limit / GIB:.1f} GiB"))
    return with_overrides(found, vram=vram, ram=ram)


def with_overrides(found: DeviceMemory, *, vram: int | None, ram: int | None) -> DeviceMemory:
    """`found` with --vram/--ram applied: a given size is taken as wholly free."""
    out = found
    if ram is not None:
        out = replace(out, ram_total=ram, ram_available=ram, source=_with(out.source, "--ram"))
        if out.unified:
            share = apple_working_set(ram)
            out = replace(out, gpu_total=share, gpu_free=share)
    if vram is not None:
        kind: DeviceKind = out.kind if out.kind != "cpu" else "gpu"
        if vram <= 0:
            kind = "cpu"
        name = out.name if out.kind != "cpu" else "GPU (--vram)"
        out = replace(out, kind=kind, name=name, gpu_total=vram, gpu_free=vram, unified=False)
        out = replace(out, source=_with(out.source, "--vram"))
    return out


def _with(source: str, override: str) -> str:
    return f"{source}, {override}" if override not in source else source


def cpu_only(ram_total: int, ram_available: int | None = None) -> DeviceMemory:
    """A machine without an accelerator."""
    avail = ram_total if ram_available is None else ram_available
    return DeviceMemory("cpu", "CPU", 0, 0, ram_total, avail)


def nvidia(
    vram_total: int, ram_total: int, *, vram_free: int | None = None, name: str = "GPU"
) -> DeviceMemory:
    """A machine with one NVIDIA GPU."""
    free = vram_total if vram_free is None else vram_free
    return DeviceMemory("cuda", name, vram_total, free, ram_total, ram_total, source="nvml")


def apple(memsize: int, *, ram_available: int | None = None, wired_limit: int = 0) -> DeviceMemory:
    """An Apple Silicon Mac with `memsize` bytes of unified memory."""
    share = wired_limit or apple_working_set(memsize)
    avail = memsize if ram_available is None else ram_available
    return DeviceMemory("metal", "Apple GPU", share, share, memsize, avail, unified=True, source="sysctl")


def apple_working_set(memsize: int) -> int:
    """Metal's recommended working set for one process on a Mac with `memsize` bytes."""
    share = APPLE_SMALL_SHARE if memsize <= APPLE_SMALL_RAM else APPLE_LARGE_SHARE
    return int(memsize * share)


# --- probes ------------------------------------------------------------------------


def _probe_gpu(ram_total: int, ram_available: int) -> DeviceMemory:
    if sys.platform == "darwin" and platform.machine() == "arm64":
        memsize = _sysctl_int("hw.memsize") or ram_total
        wired = (_sysctl_int("iogpu.wired_limit_mb") or 0) * MIB
        return apple(memsize, ram_available=ram_available, wired_limit=wired)
    gpu = _nvml() or _nvidia_smi()
    if gpu is None:
        return DeviceMemory("cpu", "CPU", 0, 0, ram_total, ram_available)
    name, total, free, source = gpu
    return DeviceMemory("cuda", name, total, free, ram_total, ram_available, source=source)


def _nvml() -> tuple[str, int, int, str] | None:
    """(name, total, free, 'nvml') over every NVIDIA GPU, or None when NVML or a GPU is missing."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append((name, int(info.total), int(info.free)))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    return (*combine_gpus(gpus), "nvml") if gpus else None


def _nvidia_smi() -> tuple[str, int, int, str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = ["--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(
            [exe, *query], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = parse_nvidia_smi(out)
    return (*combine_gpus(gpus), "nvidia-smi") if gpus else None


def combine_gpus(gpus: list[tuple[str, int, int]]) -> tuple[str, int, int]:
    """Several GPUs as one budget: llama.cpp splits layers across all of them by default."""
    if len(gpus) == 1:
        return gpus[0]
    names = sorted({name for name, _, _ in gpus})
    label = f"{len(gpus)}x {names[0]}" if len(names) == 1 else " + ".join(name for name, _, _ in gpus)
    return label, sum(t for _, t, _ in gpus), sum(f for _, _, f in gpus)


def parse_nvidia_smi(text: str) -> list[tuple[str, int, int]]:
    """(name, total bytes, free bytes) per line of `nvidia-smi --query-gpu=name,memory.total,memory.free`
    in `--format=csv,noheader,nounits` (MiB)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        try:
            gpus.append((parts[0], int(float(parts[1]) * MIB), int(float(parts[2]) * MIB)))
        except ValueError:
            continue  # "[N/A]" on some boards
    return gpus


def _sysctl_int(name: str) -> int | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=True
        ).stdout
        return int(out.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
