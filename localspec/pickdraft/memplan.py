"""The memory plan: which layers of the target and the draft go to the GPU, and what context fits.

Pure arithmetic over GGUF headers (`ModelShape.from_info`) and device figures
(`devices.DeviceMemory`), so it is tested on any machine size without one.

What llama.cpp allocates, per model (checked against its own log lines on the
real models: weights, "KV buffer size", "compute buffer size"):
- weights: every block's tensors; the token embeddings always stay on the host,
  the output head joins the GPU only when every block is there (n_gpu_layers > n_layers);
- KV cache: n_ctx x layers x KV heads x (key + value head size) x bytes per element of
  the cache type, each layer's part beside its weights;
- compute buffers: the worst-case graph for a micro-batch of 512 tokens, which is
  dominated by logits for every token (512 x vocab x 4 bytes) plus about two
  hidden-state rows per token; without flash attention (fast loading's choice for long
  contexts on the CPU), by the attention scores past ~8,000 positions: 512 x context x
  (heads + 1) x 4 bytes, touched by every prompt read that long;
- repacked weights: unless loaded batch-invariant, llama.cpp's CPU backend copies the
  Q4_0, Q4_K and IQ4_NL matrices of host layers into an interleaved layout
  ("CPU_REPACK model buffer size") for faster matrix products; the mapped file stays
  resident beside the copies;
- the plain prefill copy (engine.prefill): where the target is repacked and on the CPU, a
  second load of the same file may read prompts; its weights are the same mapped pages, so
  only its context counts: a second KV cache and its compute buffer, at the 4,096 tokens it
  loads with (it grows for a longer prompt where the memory is there then, and the daemon
  counts the growth: a plan at the model's whole context cost small machines half their context).
On the host the weights are memory-mapped and the compute buffer is malloc'd, so
what becomes resident differs from what is reserved: localspec asks for at most
k+1 rows of logits, so the 512-row logits block is reserved but never touched.
The plan counts reservations against GPU memory and resident bytes against RAM.

The draft goes to the GPU first, whole, because it runs k times per step; then as
many target layers as fit. A plan that cannot fit is refused with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.engine.config import (
    CTX_STEP,
    KV_BYTES_PER_ELEMENT,
    N_UBATCH,
    PLAIN_CONTEXT,
    LoadOptions,
    flash_attention,
    padded_ctx,
)
from localspec.errors import UserInputError
from localspec.models.gguf_info import GGUFInfo
from localspec.pickdraft.devices import GIB, MIB, DeviceMemory
from localspec.process.memory import HOST_RESERVE

# Hidden rows beside the attention scores in the compute buffer without flash attention (fitted to
# llama.cpp's reservations on the Qwen2.5 1.5B and 0.5B, rounded up).
PLAIN_ATTENTION_ROWS = 6
# Host memory llama.cpp spends on a vocabulary (token texts, lookup maps, BPE merges),
# measured on Qwen2.5 (BPE, 151,936 tokens: 48 MiB), SmolLM2 (BPE, 49,152: 19 MiB)
# and Gemma 3 (SentencePiece, 262,144: 44 MiB).
VOCAB_BYTES_PER_TOKEN = {"bpe": 340, "other": 180}
# ggml types the CPU backend repacks on x86 (AVX2) and ARM (NEON) builds.
REPACKED_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL"})
# Left free: a CUDA context takes about this much outside what NVML reported free,
# and the OS and this process need room beside the models.
GPU_RESERVE = 512 * MIB
# The planner's per-step drafts when the config leaves k to the method (auto may draft up to 15).
PLAN_K = 8


class MemoryPlanError(UserInputError):
    """The models cannot fit this machine's memory at the asked context (the message has the numbers)."""

    code = "insufficient_memory"


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of one model: sizes in bytes, counts in tokens."""

    name: str
    layer_bytes: tuple[int, ...]
    embd_bytes: int
    head_bytes: int
    tied_head: bool
    other_bytes: int
    n_vocab: int
    n_embd: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    bpe: bool
    repack_bytes: int = 0
    n_head: int = 0

    @classmethod
    def from_info(cls, info: GGUFInfo) -> ModelShape:
        tied = info.output_bytes == 0
        return cls(
            name=info.path.name,
            layer_bytes=info.layer_bytes,
            embd_bytes=info.token_embd_bytes,
            # A tied head is the embedding matrix read again for every token.
            head_bytes=info.token_embd_bytes if tied else info.output_bytes,
            tied_head=tied,
            other_bytes=info.non_layer_bytes - info.token_embd_bytes - info.output_bytes,
            n_vocab=info.vocab_size,
            n_embd=info.n_embd,
            n_head_kv=info.n_head_kv,
            head_dim_k=info.head_dim_k,
            head_dim_v=info.head_dim_v,
            n_ctx_train=info.n_ctx_train,
            bpe=info.llama_vocab_type == "bpe",
            repack_bytes=sum(n for t, n in info.block_matrix_bytes if t in REPACKED_TYPES),
            n_head=info.n_head,
        )

    @classmethod
    def from_file(cls, path: Path, cache_dir: Path | None = None) -> ModelShape:
        """The shape of the GGUF at `path`, from its header (cached in `cache_dir`)."""
        from localspec.models.gguf_info import read_gguf_info

        return cls.from_info(read_gguf_info(path, cache_dir=cache_dir))

    @property
    def n_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def weight_bytes(self) -> int:
        return (
            sum(self.layer_bytes)
            + self.embd_bytes
            + self.other_bytes
            + (0 if self.tied_head else self.head_bytes)
        )

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: every block and the head (one embedding row only)."""
        return sum(self.layer_bytes) + self.head_bytes + self.other_bytes

    def kv_bytes_per_layer(self, n_ctx: int, kv_type: str) -> int:
        per = KV_BYTES_PER_ELEMENT[kv_type]
        return int(padded_ctx(n_ctx) * self.n_head_kv * (self.head_dim_k + self.head_dim_v) * per)

    def compute_reserved(self, n_ubatch: int = N_UBATCH) -> int:
        """llama.cpp's worst-case compute buffer: logits for every row plus about two hidden rows."""
        return n_ubatch * 4 * (self.n_vocab + 2 * self.n_embd)

    def compute_resident(self, n_outputs: int, n_ubatch: int = N_UBATCH) -> int:
        """What of the compute buffer a decode asking `n_outputs` rows of logits actually touches."""
        return n_ubatch * 4 * 2 * self.n_embd + n_outputs * 4 * self.n_vocab

    def plain_attention_resident(self, n_ctx: int, n_ubatch: int = N_UBATCH) -> int:
        """What of the compute buffer reading a prompt without flash attention touches: each head's
        query-by-cache scores and the mask, f32 (n_ubatch x n_ctx each), and a few hidden rows.
        llama.cpp reserved 1.5B: 432.0 MiB at 16,384 positions and 848.0 at 32,768 (this: 434, 850);
        0.5B: 489.3 and 969.3 (490, 970). Reading a 16,000-token prompt there touched all of it:
        the engine's anonymous memory grew 520 MiB more than with flash attention (session 44).
        Counted for the target's own context too, which reads shorter inputs (up to 1/50 of its
        cache, engine.llama.PREFILL_PER_CACHED, beside a plain prefill copy): a safe bound."""
        return n_ubatch * 4 * ((self.n_head + 1) * padded_ctx(n_ctx) + PLAIN_ATTENTION_ROWS * self.n_embd)

    @property
    def vocab_bytes(self) -> int:
        return self.n_vocab * VOCAB_BYTES_PER_TOKEN["bpe" if self.bpe else "other"]


def draft_shape(path: Path | None, cache_dir: Path | None = None) -> ModelShape | None:
    """A draft's shape; None without one, or where its header cannot be read: the engine refuses
    such a draft and serves the target alone, so it takes nothing."""
    if path is None:
        return None
    try:
        return ModelShape.from_file(path, cache_dir)
    except Exception:
        return None


@dataclass(frozen=True)
class Placement:
    """One model's share of the plan. gpu_layers counts blocks; `all_on_gpu` adds the head."""

    name: str
    n_layers: int
    gpu_layers: int
    all_on_gpu: bool
    gpu_bytes: int
    host_bytes: int
    weights_bytes: int
    kv_bytes: int

    @property
    def llama_gpu_layers(self) -> int:
        """The n_gpu_layers to load with: -1 (everything) or the number of blocks."""
        return -1 if self.all_on_gpu else self.gpu_layers

    def describe(self) -> str:
        where = (
            "all on the GPU" if self.all_on_gpu else f"{self.gpu_layers}/{self.n_layers} layers on the GPU"
        )
        if self.gpu_layers == 0:
            where = "on the CPU"
        return (
            f"{self.name}: {where}; weights {_gib(self.weights_bytes)}, KV {_gib(self.kv_bytes)}, "
            f"GPU {_gib(self.gpu_bytes)}, host {_gib(self.host_bytes)}"
        )


@dataclass(frozen=True)
class MemoryPlan:
    """Where everything goes, what it costs, and the largest context this placement allows."""

    n_ctx: int
    max_n_ctx: int
    kv_type: str
    target: Placement
    draft: Placement | None
    device: DeviceMemory
    gpu_budget: int
    host_budget: int

    @property
    def gpu_bytes(self) -> int:
        return self.target.gpu_bytes + (self.draft.gpu_bytes if self.draft else 0)

    @property
    def host_bytes(self) -> int:
        """Resident host memory the models take (the process's own baseline not included)."""
        return self.target.host_bytes + (self.draft.host_bytes if self.draft else 0)

    def describe(self) -> list[str]:
        lines = [
            f"context {self.n_ctx} tokens (largest that fits: {self.max_n_ctx}), KV cache {self.kv_type}"
        ]
        lines += [p.describe() for p in (self.target, self.draft) if p is not None]
        budget = f"host {_gib(self.host_bytes)} of {_gib(self.host_budget)}"
        if self.device.has_gpu:
            budget = f"GPU {_gib(self.gpu_bytes)} of {_gib(self.gpu_budget)}; {budget}"
        return [*lines, budget]


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class LoadSpec:
    """How both models are loaded: context, KV cache type, logits rows asked per decode, repacking."""

    n_ctx: int
    kv_type: str = "f16"
    n_outputs: int = 9
    repack: bool = True
    # A plain prefill copy's context beside this model's (the target's, when it may get one).
    prefill_copy: bool = False
    # The flash_attn setting (None: as engine.config.flash_attention decides for the placement).
    flash_attn: bool | None = None

    def flash_attention(self, on_gpu: bool) -> bool:
        options = LoadOptions(
            n_ctx=self.n_ctx,
            kv_type=self.kv_type,
            batch_invariant=not self.repack,
            flash_attn=self.flash_attn,
        )
        return flash_attention(options, on_gpu)


def place(shape: ModelShape, gpu_layers: int, all_on_gpu: bool, load: LoadSpec) -> Placement:
    """The bytes one model takes on each side when its last `gpu_layers` blocks are on the GPU."""
    n = shape.n_layers
    gpu_layers = min(gpu_layers, n)
    all_on_gpu = all_on_gpu and gpu_layers == n
    kv_layer = shape.kv_bytes_per_layer(load.n_ctx, load.kv_type)
    # llama.cpp offloads the last blocks first (i >= n_layers - n_gpu_layers).
    gpu_weights = sum(shape.layer_bytes[n - gpu_layers :])
    head = shape.head_bytes + shape.other_bytes
    gpu = gpu_weights + gpu_layers * kv_layer
    host = shape.embd_bytes + (sum(shape.layer_bytes) - gpu_weights) + (n - gpu_layers) * kv_layer
    host += shape.vocab_bytes + 4 * shape.n_vocab  # the output buffer keeps one row of logits
    if load.repack and n:
        host += shape.repack_bytes * (n - gpu_layers) // n
    # Without flash attention, a context reading a prompt touches a score block that grows with the
    # context: as much as the logits' rows, or (from ~8,000 positions for these models) more.
    attention = 0 if load.flash_attention(gpu_layers > 0) else shape.plain_attention_resident(load.n_ctx)
    if load.prefill_copy and load.repack and gpu_layers == 0:
        host += prefill_copy_bytes(shape, load)
    if gpu_layers:
        # The logits block of the compute buffer sits where the head runs.
        gpu += shape.compute_reserved() if all_on_gpu else N_UBATCH * 4 * 2 * shape.n_embd
    if all_on_gpu:
        gpu += head
    else:
        # A tied head is the host's embedding matrix again: no second copy on the host.
        host += (0 if shape.tied_head else shape.head_bytes) + shape.other_bytes
        host += max(shape.compute_resident(load.n_outputs), attention)
    return Placement(
        name=shape.name,
        n_layers=n,
        gpu_layers=gpu_layers,
        all_on_gpu=all_on_gpu,
        gpu_bytes=gpu,
        host_bytes=host,
        weights_bytes=shape.weight_bytes,
        kv_bytes=n * kv_layer,
    )


def prefill_copy_bytes(shape: ModelShape, load: LoadSpec) -> int:
    """What a plain prefill copy takes as it loads, at PLAIN_CONTEXT tokens or the model's context
    if smaller: its KV cache and compute buffer, in the model's attention layout. It grows to read
    longer prompts only where the memory is there then (engine.llama), and the daemon counts what
    it grew by (EngineInfo.prefill_grown_bytes)."""
    n_ctx = min(load.n_ctx, PLAIN_CONTEXT)
    plain = not load.flash_attention(False)
    attention = shape.plain_attention_resident(n_ctx) if plain else 0
    kv = shape.n_layers * shape.kv_bytes_per_layer(n_ctx, load.kv_type)
    return kv + max(shape.compute_resident(1), attention)


def plan_memory(
    target: ModelShape,
    draft: ModelShape | None,
    device: DeviceMemory,
    *,
    n_ctx: int,
    kv_type: str = "f16",
    k: int = PLAN_K,
    repack: bool = True,
    plain_prefill: bool | None = None,
    flash_attn: bool | None = None,
) -> MemoryPlan:
    """Place the draft (whole, on the GPU if it fits) then the target; MemoryPlanError if it cannot fit.

    `k` is the most tokens drafted per step (k + 1 rows of logits per verify); `repack`
    whether llama.cpp repacks host weights (LoadOptions.batch_invariant off); `plain_prefill`
    whether the target may get a plain prefill copy (None: wherever it could, as LoadOptions'
    default measures at load: the plan counts what the engine may take); `flash_attn` the setting
    (None: engine.config.flash_attention's choice, off for long contexts on the CPU).
    """
    if kv_type not in KV_BYTES_PER_ELEMENT:
        raise UserInputError(
            f"unknown KV cache type {kv_type!r}; use one of {', '.join(KV_BYTES_PER_ELEMENT)}"
        )
    load = LoadSpec(n_ctx, kv_type, k + 1, repack, flash_attn=flash_attn)
    gpu_budget, host_budget = budgets(device)
    draft_place = _place_draft(draft, gpu_budget, load)
    gpu_left = gpu_budget - (draft_place.gpu_bytes if draft_place else 0)
    prefill = repack if plain_prefill is None else plain_prefill
    target_load = replace(load, prefill_copy=prefill)
    target_place = _place_target(target, gpu_left, target_load)
    host = target_place.host_bytes + (draft_place.host_bytes if draft_place else 0)
    gpu = target_place.gpu_bytes + (draft_place.gpu_bytes if draft_place else 0)
    # Unified memory: the GPU's share is the same RAM, so both parts must fit it together.
    host_need = host + gpu if device.unified else host
    if host_need > host_budget:
        raise _too_big(target, draft, device, n_ctx, host_need, 0 if device.unified else gpu, host_budget)
    plan = MemoryPlan(n_ctx, n_ctx, kv_type, target_place, draft_place, device, gpu_budget, host_budget)
    return replace(plan, max_n_ctx=_max_ctx(plan, target, draft, target_load))


def _too_big(
    target: ModelShape,
    draft: ModelShape | None,
    device: DeviceMemory,
    n_ctx: int,
    need: int,
    gpu: int,
    free: int,
) -> MemoryPlanError:
    names = target.name + (f" and {draft.name}" if draft else "")
    beside = f" beside {_gib(gpu)} on the GPU" if gpu else ""
    hint = "a smaller --ctx, a q8_0 KV cache" + (
        ", a smaller model or no draft" if draft else " or a smaller model"
    )
    return MemoryPlanError(
        f"{names} at {n_ctx} tokens of context need {_gib(need)} of RAM{beside}, but {_gib(free)} "
        f"is free for them ({device.describe()}); try {hint}"
    )


def budgets(device: DeviceMemory) -> tuple[int, int]:
    """(GPU bytes, host bytes) the models may take, reserves left aside."""
    gpu = max(0, device.gpu_free - (0 if device.unified else GPU_RESERVE)) if device.has_gpu else 0
    return gpu, max(0, device.ram_available - HOST_RESERVE)


def _place_draft(draft: ModelShape | None, gpu_budget: int, load: LoadSpec) -> Placement | None:
    if draft is None:
        return None
    whole = place(draft, draft.n_layers, True, load)
    # Whole or not at all: a split draft pays the host's speed k times per step.
    return whole if whole.gpu_bytes <= gpu_budget else place(draft, 0, False, load)


def _place_target(target: ModelShape, gpu_left: int, load: LoadSpec) -> Placement:
    whole = place(target, target.n_layers, True, load)
    if whole.gpu_bytes <= gpu_left:
        return whole
    best = place(target, 0, False, load)
    for layers in range(1, target.n_layers + 1):
        trial = place(target, layers, False, load)
        if trial.gpu_bytes > gpu_left:
            break
        best = trial
    return best


def _max_ctx(plan: MemoryPlan, target: ModelShape, draft: ModelShape | None, load: LoadSpec) -> int:
    """The largest context (a multiple of 256, at most the models' training context) this placement fits."""
    limit = min(target.n_ctx_train, draft.n_ctx_train if draft else target.n_ctx_train)
    # Memory grows with the context, so the largest fit is found by bisection over 256-token steps.
    low, high = plan.n_ctx // CTX_STEP, max(plan.n_ctx, limit) // CTX_STEP
    while low < high:
        mid = (low + high + 1) // 2
        if _fits_same_placement(plan, target, draft, replace(load, n_ctx=mid * CTX_STEP)):
            low = mid
        else:
            high = mid - 1
    return max(plan.n_ctx, low * CTX_STEP)


def _fits_same_placement(
    plan: MemoryPlan, target: ModelShape, draft: ModelShape | None, load: LoadSpec
) -> bool:
    # The target's load, with its plain prefill copy where it may have one; the draft never has one.
    parts: Sequence[tuple[ModelShape, Placement, LoadSpec]] = [(target, plan.target, load)]
    if draft is not None and plan.draft is not None:
        parts = [*parts, (draft, plan.draft, replace(load, prefill_copy=False))]
    gpu = host = 0
    for shape, p, spec in parts:
        again = place(shape, p.gpu_layers, p.all_on_gpu, spec)
        gpu, host = gpu + again.gpu_bytes, host + again.host_bytes
    if plan.device.unified:
        host += gpu
    return gpu <= plan.gpu_budget and host <= plan.host_budget
