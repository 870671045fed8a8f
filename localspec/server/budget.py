"""The memory the daemon's loaded models may take together, and what one model takes.

A model's footprint is the memory plan's (pickdraft.memplan): weights, KV cache and
compute buffers of the target and its draft, on the GPU and on the host, at the
context the daemon loads with. A load plans with the machine as it is when it loads
(`Room.alone`): the memory free at that moment plus what the loaded models hold, so
that evicting idle ones counts what it frees, and memory other processes took or freed
since the daemon started is seen (`Room.budget`: reserves left aside). The `max_resident` setting
optionally caps the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from localspec.engine.config import EngineConfig
from localspec.pickdraft.devices import GIB, MIB, DeviceMemory, detect_memory
from localspec.pickdraft.memplan import PLAN_K, MemoryPlanError, ModelShape, budgets, draft_shape, plan_memory
from localspec.process.memory import mapped_file_bytes


@dataclass(frozen=True)
class Footprint:
    """Bytes one loaded model (target and draft) takes on the GPU and on the host."""

    gpu: int = 0
    host: int = 0

    @property
    def total(self) -> int:
        return self.gpu + self.host

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.gpu + other.gpu, self.host + other.host)

    def describe(self) -> str:
        return f"GPU {size(self.gpu)}, host {size(self.host)}" if self.gpu else f"{size(self.host)} of RAM"


def size(n: int) -> str:
    """Bytes for people: GiB from one GiB up, MiB below."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.1f} MiB"


@dataclass(frozen=True)
class Budget:
    """What the loaded models may take together: the device's plan, and an optional cap on the sum."""

    gpu: int
    host: int
    unified: bool = False
    cap: int | None = None
    device: str = ""

    @classmethod
    def for_device(cls, device: DeviceMemory, cap: int | None = None) -> Budget:
        gpu, host = budgets(device)
        return cls(gpu, host, device.unified, cap, device.describe())

    def fits(self, used: Footprint, new: Footprint, saved: Footprint | None = None) -> bool:
        """Whether `new` fits beside the loaded models (`used`) and their saved caches (`saved`,
        which take the machine's memory but have a bound of their own, not max_resident's)."""
        both = used + new
        if self.cap is not None and both.total > self.cap:
            return False
        both = both + (saved or Footprint())
        if self.unified:
            return both.total <= self.host
        return both.host <= self.host and both.gpu <= self.gpu

    def describe(self) -> str:
        """'2.00 GiB (max_resident)' or 'host 14.20 GiB, GPU 7.50 GiB (…device…)'."""
        parts = []
        if self.cap is not None:
            parts.append(f"{size(self.cap)} (max_resident)")
        plan = f"host {size(self.host)}" + (f", GPU {size(self.gpu)}" if self.gpu else "")
        parts.append(f"{plan} by the memory plan ({self.device})" if self.device else plan)
        return " and ".join(parts)

    def refuse(self, name: str, need: Footprint) -> MemoryPlanError:
        return MemoryPlanError(
            f"{name} needs {size(need.total)} ({need.describe()}: weights, KV cache and compute buffers "
            f"of the model and its draft) but the loaded models may take at most {self.describe()}; "
            "raise max_resident, lower --ctx, use a q8_0 KV cache or pin no draft for it"
        )


Probe = Callable[[], DeviceMemory]


@dataclass(frozen=True)
class Room:
    """Where each load's budget comes from: the machine's memory, read when the model loads."""

    probe: Probe
    cap: int | None = None

    def alone(self, held: Footprint) -> DeviceMemory:
        """The machine as a load sees it: the memory free now plus what the loaded models hold.

        Blocking (it probes the machine). `held` is the loaded models' footprints, which the free
        memory no longer includes: a load that evicts them may use it again. A model is planned
        (where its layers go, whether it can fit at all) against this.
        """
        device = self.probe()
        if device.unified:  # one memory; the GPU's share is Metal's working set, a limit, not free memory
            return replace(device, ram_available=device.ram_available + held.total)
        gpu_free = device.gpu_free + held.gpu if device.has_gpu else device.gpu_free
        return replace(device, ram_available=device.ram_available + held.host, gpu_free=gpu_free)

    def budget(self, device: DeviceMemory) -> Budget:
        """What the models may take together on `device` (from `alone`), reserves left aside."""
        gpu, host = budgets(device)
        return Budget(gpu, host, device.unified, self.cap, device.describe())


def live_memory() -> DeviceMemory:
    """This machine's memory now, less the model files this process maps: the loaded models'
    footprints are counted in full beside the free memory (process.memory.mapped_file_bytes)."""
    device = detect_memory()
    return replace(device, ram_available=max(0, device.ram_available - mapped_file_bytes()))


def footprint(config: EngineConfig, device: DeviceMemory) -> Footprint:
    """What loading `config` takes, by the memory plan (MemoryPlanError when it cannot fit at all).

    Blocking: reads the GGUF headers (cached). Planned against the whole device, as if alone.
    """
    target = ModelShape.from_file(config.target, config.cache_dir)
    draft = draft_shape(config.draft, config.cache_dir)
    if config.load.rpc:
        # The target's layers and KV cache are on the RPC workers (pickdraft.rpcplan plans them);
        # here only the draft counts, planned as if it were the model.
        if draft is None:
            return Footprint()
        target, draft = draft, None
    plan = plan_memory(
        target,
        draft,
        device,
        n_ctx=config.load.n_ctx,
        kv_type=config.load.kv_type,
        k=config.k or PLAN_K,
        repack=not config.load.batch_invariant,
        # The setting as given (None: counted wherever the engine may attach one); the draft standing
        # in for an RPC target never gets a plain prefill copy.
        plain_prefill=False if config.load.rpc else config.load.plain_prefill,
        flash_attn=config.load.flash_attn,
    )
    return Footprint(plan.gpu_bytes, plan.host_bytes)
