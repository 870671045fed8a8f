"""The context `serve` and `chat` load when none is given: as long as the models and the machine allow.

Agents send long prompts: Claude Code's system prompt and tools alone are ~20,000 tokens,
Codex's ~8,000, and an agent's turn adds files on top. At a fixed 4,096 tokens every such request
was refused as past the context. llama-server loads the model's training context, shrunk to
what its memory fit allows; Ollama loads 4,096 tokens below 24 GiB of VRAM, 32,768 below 48 GiB
and 262,144 above (ollama docs/context-length.mdx), and tells agent users to raise it to 64,000.

Here: the target's training context, halved while it does not fit, and never so large that it moves
a layer off the GPU or that its KV caches and buffers take more than a quarter of the RAM the
models leave free (the person's other programs need it; a GPU's memory is the models' own, and
unified memory is RAM); at least 4,096, the context localspec always loaded. Pure arithmetic over
the memory plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from localspec.pickdraft.devices import DeviceMemory
from localspec.pickdraft.memplan import CTX_STEP, PLAN_K, MemoryPlan, MemoryPlanError, ModelShape, plan_memory

# The context loaded when memory is short, and the least `auto` loads: what localspec loaded before.
AUTO_CTX_MIN = 4096
# The share of the RAM left free beside the models (at AUTO_CTX_MIN) a larger context may take.
AUTO_CTX_SHARE = 0.25


def auto_context(
    target: ModelShape,
    draft: ModelShape | None,
    device: DeviceMemory,
    *,
    kv_type: str = "f16",
    k: int = PLAN_K,
    repack: bool = True,
    plain_prefill: bool | None = None,
    flash_attn: bool | None = None,
) -> int:
    """The context to load `target` (and `draft`) with on `device` (see the module's docstring)."""
    plan = partial(
        plan_memory,
        target,
        draft,
        device,
        kv_type=kv_type,
        k=k,
        repack=repack,
        plain_prefill=plain_prefill,
        flash_attn=flash_attn,
    )
    try:
        floor = plan(n_ctx=AUTO_CTX_MIN)
    except MemoryPlanError:
        return AUTO_CTX_MIN  # the load says what does not fit, at the context it always had
    # The target's training context: a draft trained for less drafts worse past its own (auto sees its
    # acceptance fall), its guesses verified like any others.
    for n_ctx in _sizes(target.n_ctx_train):
        try:
            grown = plan(n_ctx=n_ctx)
        except MemoryPlanError:
            continue
        if _within_share(floor, grown):
            return n_ctx
    return AUTO_CTX_MIN


def _sizes(trained: int) -> Iterator[int]:
    """The training context (whole 256-token steps), then the powers of two below it, down to past
    AUTO_CTX_MIN: a smaller context is only worth its own size where the larger does not fit."""
    top = trained // CTX_STEP * CTX_STEP
    if top > AUTO_CTX_MIN:
        yield top
    size = 1 << (top.bit_length() - 1) if top > 0 else 0
    if size == top:
        size //= 2
    while size > AUTO_CTX_MIN:
        yield size
        size //= 2


def _within_share(floor: MemoryPlan, grown: MemoryPlan) -> bool:
    """Whether `grown` keeps `floor`'s layers on the GPU, and what it takes in RAM beyond `floor`
    is within AUTO_CTX_SHARE of what the models leave free there at AUTO_CTX_MIN."""
    same = floor.target.gpu_layers == grown.target.gpu_layers and (
        floor.draft is None or grown.draft is None or floor.draft.gpu_layers == grown.draft.gpu_layers
    )
    if not same:
        return False
    unified = floor.device.unified
    free = floor.host_budget - floor.host_bytes - (floor.gpu_bytes if unified else 0)
    more = grown.host_bytes - floor.host_bytes + (grown.gpu_bytes - floor.gpu_bytes if unified else 0)
    return more <= AUTO_CTX_SHARE * max(free, 0)
