"""The memory the daemon's loaded models may take together, and what one model takes.

A model's footprint is the memory plan's (pickdraft.memplan): weights, KV cache and
compute buffers of the target and its draft, on the GPU and on the host, at the
context the daemon loads with. The budget is the plan's for this machine as it was
when the daemon started (free RAM and GPU memory, reserves left aside), optionally
capped by the `max_resident` setting. Memory other processes take or free later is
not tracked: the budget is a plan, not a probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.engine.config import EngineConfig
from localspec.pickdraft.devices import GIB, MIB, DeviceMemory
from localspec.pickdraft.memplan import MemoryPlanError, ModelShape, budgets, plan_memory

# The planner's per-step drafts when the config leaves k to the method (auto may draft up to 15).
PLAN_K = 8


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

    def fits(self, used: Footprint, new: Footprint) -> bool:
        both = used + new
        if self.cap is not None and both.total > self.cap:
            return False
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


def footprint(config: EngineConfig, device: DeviceMemory) -> Footprint:
    """What loading `config` takes, by the memory plan (MemoryPlanError when it cannot fit at all).

    Blocking: reads the GGUF headers (cached). Planned against the whole device, as if alone.
    """
    from localspec.models.gguf_info import read_gguf_info

    target = ModelShape.from_info(read_gguf_info(config.target, cache_dir=config.cache_dir))
    draft = _shape(config.draft, config.cache_dir)
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
    )
    return Footprint(plan.gpu_bytes, plan.host_bytes)


def _shape(path: Path | None, cache_dir: Path | None) -> ModelShape | None:
    from localspec.models.gguf_info import read_gguf_info

    if path is None:
        return None
    try:
        return ModelShape.from_info(read_gguf_info(path, cache_dir=cache_dir))
    except Exception:  # a draft the engine will refuse (and load without) takes nothing
        return None
