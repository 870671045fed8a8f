"""What the engine loads and how: plain settings, built at the edge, that import no llama.cpp.

`resolve`, pick-draft and the daemon build these without loading a model, so this
module stays light; `engine.llama` and `engine.worker` read them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from localspec.engine.drafters.base import DRAFT_MIN_CONFIDENCE
from localspec.process.cgroup import cpu_quota
from localspec.types import Method


def default_threads() -> int:
    """The physical cores, but no more than the CPUs this process may use: in a container given 2
    CPUs of a 64-core host, 32 threads would wait on each other's time slices."""
    import psutil

    return max(1, min(psutil.cpu_count(logical=False) or os.cpu_count() or 1, usable_cpus()))


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, within its cgroups' CPU quota (v2 or v1,
    its own or one above it: process.cgroup)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity masks
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def threads_warning(threads: int) -> str | None:
    """A line for a thread count above the CPUs this process may use, else None."""
    cpus = usable_cpus()
    if threads <= cpus:
        return None
    # Measured on 2 cores (docs/benchmarks.md, session 57): 64 threads decoded 3.4 tok/s against 27.7.
    return (
        f"{threads} threads on {cpus} usable CPU{'s' if cpus > 1 else ''}: llama.cpp's threads will wait "
        f"on each other and decode several times slower; use --threads {cpus} or leave it unset"
    )


@dataclass(frozen=True)
class LoadOptions:
    """How to load one model. gpu_layers: None = all when offload is supported, -1 = all, 0 = CPU.

    By default a model loads as llama.cpp itself loads it (weights repacked for the CPU's kernels),
    but for flash attention, off for long contexts on the CPU (`flash_attn`): batched verifies are cheap, and
    speculative output is the target's distribution, greedy output identical to the target alone
    up to float rounding, as in llama.cpp's, vLLM's and LM Studio's speculation. batch_invariant
    (`--exact`) turns repacking off and forces flash attention, which makes verifies of up to
    EXACT_VERIFY_BATCH positions round like one-token decoding on the CPU
    (scripts/batch_rounding.py): greedy output bit-identical to the target alone, at a cost
    (docs/benchmarks.md: 6% of plain decoding on AVX2, 20-30% on AVX-512, and verifies that batch
    worse).
    """

    n_ctx: int = 4096
    n_threads: int | None = None
    gpu_layers: int | None = None
    kv_type: str = "f16"
    n_batch: int = 512
    batch_invariant: bool = False
    # Read long prompts with a second, plain (not repacked) copy of the weights and hand the KV cache
    # over (engine.prefill): on AVX-512 CPUs repacked weights decode faster but evaluate prompts 1.5x
    # slower. None: where measured faster on this machine (cached); never with batch_invariant or
    # layers on a GPU.
    plain_prefill: bool | None = None
    # Flash attention in fast loading: None keeps llama.cpp's choice on a GPU, on RPC workers, with
    # a quantized cache and below 8192 positions, and turns it off otherwise (flash_attention below);
    # True or False force it. batch_invariant always has it on.
    flash_attn: bool | None = None
    # RPC workers ('host:port') that hold the model's layers (`--rpc`); the engine loads its
    # drafts without them, so they stay on this machine.
    rpc: tuple[str, ...] = ()


# The largest batch that rounds exactly like one-token decoding with batch_invariant loading on the
# CPU (llama.cpp as vendored by llama-cpp-python 0.3.36, Q4_K_M weights). Measured on the Qwen2.5-Coder
# pair: fixed n-gram drafting with k <= 6 (verify batches of <= 7) stayed token-identical to the target
# alone on all 8 bench prompts at 128 tokens; k = 7 and 8 (batches of 8, 9) diverged on two of them, at
# tokens 15 and 50, at positions the near-tie re-decide does not catch. See docs/benchmarks.md.
EXACT_VERIFY_BATCH = 7
# ...and only while every position it decodes is under this one. On the CPU, llama.cpp computes one
# query's attention over 512+ cache cells split across its threads and reduced (ggml-cpu ops.cpp,
# use_split_kv_path), and two or more queries' in one pass; the cache is padded to 256 cells
# (llama_kv_cache::get_n_kv), so from position 256 on a one-token decode rounds differently from
# every batch (measured after 900-token prompts: logits up to 0.51 apart; after 70, identical).
# Verified in batches there, `--exact` left the target alone's text on 10 of the 31 bench prompts.
EXACT_POSITIONS = 256
# The same with the model's layers on a CUDA GPU: none wider than one token. Measured on an H200
# (scripts/gpu_measure.py, llama.cpp as vendored by llama-cpp-python 0.3.36, Qwen2.5-Coder-1.5B
# shaped Q4_K_M): every verify of 2 to 64 positions changed logits against one-token decoding, with
# and without flash attention, and greedy draft and layerskip output left `none`'s at near-ties.
# So --exact on a GPU drafts nothing: bit-identical, at plain decoding's speed. docs/benchmarks.md.
EXACT_VERIFY_BATCH_GPU = 1


# What a context takes beside the weights, for those that size one (pickdraft.memplan, and a plain
# prefill copy's growth: engine.llama). Bytes per element of each KV cache type: ggml blocks of 32
# values (q8_0: 32 bytes plus an f16 scale; q4_0: 16 bytes plus the scale).
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
N_UBATCH = 512
CTX_STEP = 256  # llama.cpp pads a context to a multiple of this
# A plain prefill copy's context to begin with (engine.prefill): its cache is a second one beside
# the model's (0.9 GiB more for the 1.5B at 32,768 tokens, measured: docs/benchmarks.md session 57),
# and most prompts are far shorter; a longer read grows it where the memory is there.
PLAIN_CONTEXT = 4096


def padded_ctx(n_ctx: int) -> int:
    return -(-n_ctx // CTX_STEP) * CTX_STEP


# Contexts this large are for long prompts: fast loading reads and decodes them without flash
# attention on the CPU (flash_attention).
LONG_CONTEXT = 8192


def flash_attention(options: LoadOptions, on_gpu: bool) -> bool:
    """Whether a model loaded with `options` decodes with flash attention: always with
    batch_invariant; in fast loading llama.cpp's choice (its `auto`, which turns it on for the CPU
    too), but off for the CPU alone with an f16 cache and a context of LONG_CONTEXT or more.
    Measured on 2 AVX-512 cores (1.5B, docs/benchmarks.md session 43): plain attention reads a
    6,000-token prompt 1.29x faster, decodes 10% faster after it and verifies 16 positions there in
    half the time; after the bench set's prompts (100-1,100 tokens) it decodes 1-3% slower and
    reads them 1-7% slower. The two layouts' caches cannot be handed over (llama.cpp stores V
    transposed without flash attention), so one context keeps one; a context sized for long prompts
    gets the one that is faster for them, for more compute buffer (the memory plan counts it:
    pickdraft.memplan). A quantized V cache needs flash attention in llama.cpp."""
    if options.batch_invariant:
        return True
    if options.flash_attn is not None:
        return options.flash_attn
    return on_gpu or bool(options.rpc) or options.kv_type != "f16" or options.n_ctx < LONG_CONTEXT


@dataclass(frozen=True)
class EngineConfig:
    """What to load and how. Built once at the edge (CLI, daemon) from Settings."""

    target: Path
    draft: Path | None = None
    method: Method = "auto"
    k: int | None = None  # None: each method's default (SpecParams)
    load: LoadOptions = field(default_factory=LoadOptions)
    draft_gpu_layers: int | None = None
    queue_size: int = 16
    # Fixed draft/layerskip methods stop drafting below this top probability (auto decides for itself).
    draft_min_confidence: float = DRAFT_MIN_CONFIDENCE
    # Where calibration curves and GGUF header caches persist, and where layer-skip drafts are written.
    # The engine reads no environment: the edge (resolve) passes the user's folders; None keeps them
    # in a private temporary folder for the engine's lifetime.
    cache_dir: Path | None = None
    derived_dir: Path | None = None
    # Tokens of earlier requests' prompts and outputs kept for n-gram drafting (in memory only;
    # 0 turns it off): agent loops and editors send and re-emit the same code request after request.
    ngram_memory_tokens: int = 16384
    # Bytes of earlier conversations' KV caches kept in memory (engine.promptcache): a conversation
    # that comes back after another's request goes on from its cache. The edge sets it from
    # Settings.prompt_cache; 0 (as here) keeps none.
    prompt_cache_bytes: int = 0
