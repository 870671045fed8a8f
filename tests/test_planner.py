"""The memory plan on synthetic machines (4, 8 and 24 GiB GPUs, a 16 GB Mac, CPU only), the arithmetic
against llama.cpp's own buffer sizes on the real models, and planned against measured RSS on this CPU.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_gguf_info import shared_cache

from localspec.engine.config import LONG_CONTEXT, PLAIN_CONTEXT, LoadOptions
from localspec.models.gguf_info import read_gguf_info
from localspec.pickdraft.devices import GIB, MIB, DeviceMemory, apple, cpu_only, nvidia
from localspec.pickdraft.memplan import (
    CTX_STEP,
    GPU_RESERVE,
    LoadSpec,
    MemoryPlan,
    MemoryPlanError,
    ModelShape,
    budgets,
    place,
    plan_memory,
)


def shape(
    name: str,
    n_layers: int,
    layer_mib: float,
    *,
    embd_mib: float,
    head_mib: float,
    n_vocab: int = 152064,
    n_embd: int = 3584,
    n_head_kv: int = 4,
    head_dim: int = 128,
    n_ctx_train: int = 32768,
    n_head: int = 28,
) -> ModelShape:
    return ModelShape(
        name=name,
        layer_bytes=(int(layer_mib * MIB),) * n_layers,
        embd_bytes=int(embd_mib * MIB),
        head_bytes=int(head_mib * MIB),
        tied_head=False,
        other_bytes=64 * 1024,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_ctx_train=n_ctx_train,
        bpe=True,
        n_head=n_head,
    )


# About a 7B model with 8 KV heads and Qwen2.5-0.5B at Q4_K_M: 4.4 GiB and 0.45 GiB of weights.
TARGET_7B = shape("7b.gguf", 28, 134, embd_mib=292, head_mib=426, n_head_kv=8)
DRAFT_05B = shape(
    "0.5b.gguf", 24, 9.8, embd_mib=89, head_mib=138, n_embd=896, n_head_kv=2, head_dim=64, n_head=14
)


def plan(device: DeviceMemory, n_ctx: int = 4096, draft: ModelShape | None = DRAFT_05B) -> MemoryPlan:
    return plan_memory(TARGET_7B, draft, device, n_ctx=n_ctx)


def assert_within_budget(p: MemoryPlan) -> None:
    assert p.gpu_bytes <= p.gpu_budget
    assert p.host_bytes + (p.gpu_bytes if p.device.unified else 0) <= p.host_budget


def test_cpu_only_puts_everything_on_the_host() -> None:
    p = plan(cpu_only(16 * GIB))
    assert p.draft is not None
    assert (p.target.gpu_layers, p.draft.gpu_layers, p.gpu_bytes) == (0, 0, 0)
    assert p.target.llama_gpu_layers == 0
    # Weights, KV cache and the vocabulary and compute it touches, for both models, and the plain
    # prefill copy's context (engine.prefill): the same mapped weights, a KV cache of its own.
    alone = plan_memory(TARGET_7B, DRAFT_05B, cpu_only(16 * GIB), n_ctx=4096, plain_prefill=False)
    assert 5.0 * GIB < alone.host_bytes < 5.7 * GIB
    copy = TARGET_7B.n_layers * TARGET_7B.kv_bytes_per_layer(4096, "f16") + TARGET_7B.compute_resident(1)
    assert p.host_bytes == alone.host_bytes + copy
    assert p.max_n_ctx == 32768  # 16 GiB holds the training context's KV cache (3.5 GiB + 0.375 GiB)
    assert_within_budget(p)
    # Without repacking (--exact) there is no plain copy to read prompts with.
    exact = plan_memory(TARGET_7B, DRAFT_05B, cpu_only(16 * GIB), n_ctx=4096, repack=False)
    assert exact.host_bytes <= alone.host_bytes < p.host_bytes


def test_long_contexts_on_the_cpu_count_plain_attentions_scores() -> None:
    """Fast loading reads long contexts without flash attention on the CPU (engine.config.
    flash_attention): each context that reads prompts, the target's, its plain prefill copy's and
    the draft's, touches (heads + 1) score rows of its context per token of a micro-batch (the
    copy's context: the 4,096 tokens it loads with)."""
    n_ctx = 16384

    def host(device: DeviceMemory | None = None, **kw: bool) -> int:
        device = device or cpu_only(64 * GIB)
        return plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=n_ctx, **kw).host_bytes  # type: ignore[arg-type]

    plain = host()
    contexts = ((TARGET_7B, n_ctx), (TARGET_7B, PLAIN_CONTEXT), (DRAFT_05B, n_ctx))
    scores = [s.plain_attention_resident(n) for s, n in contexts]
    touched = [s.compute_resident(n) for s, n in ((TARGET_7B, 9), (TARGET_7B, 1), (DRAFT_05B, 9))]
    assert plain - host(flash_attn=True) == sum(scores) - sum(touched) > 1 * GIB
    assert host(flash_attn=False) == plain
    assert host(repack=False) == host(repack=False, flash_attn=True)  # --exact: always flash attention
    assert plain_attention_grows_from(TARGET_7B) == LONG_CONTEXT
    # Layers on a GPU keep llama.cpp's choice (flash attention on): no score block on the host.
    gpu = nvidia(80 * GIB, 64 * GIB)
    assert host(gpu) == host(gpu, flash_attn=True)


def test_the_plain_copy_is_counted_at_the_context_it_loads_with() -> None:
    """The copy loads with PLAIN_CONTEXT tokens and grows for a longer prompt only where the memory
    is there then (engine.llama): counted at the model's whole context, it took half a small
    machine's context for a cache most prompts never fill."""
    device = cpu_only(64 * GIB)
    for n_ctx in (2048, 32768):
        with_copy = plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=n_ctx)
        alone = plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=n_ctx, plain_prefill=False)
        n = min(n_ctx, PLAIN_CONTEXT)
        # At 32,768 the model reads without flash attention on the CPU, and the copy in its layout.
        plain = n_ctx >= LONG_CONTEXT
        scores = TARGET_7B.plain_attention_resident(n) if plain else TARGET_7B.compute_resident(1)
        kv = TARGET_7B.n_layers * TARGET_7B.kv_bytes_per_layer(n, "f16")
        assert with_copy.host_bytes - alone.host_bytes == kv + scores
    # The largest context a plan reports counts the copy too (it left it out), at its own size.
    small = cpu_only(8 * GIB)
    with_copy = plan_memory(TARGET_7B, DRAFT_05B, small, n_ctx=4096)
    alone = plan_memory(TARGET_7B, DRAFT_05B, small, n_ctx=4096, plain_prefill=False)
    assert 4096 < with_copy.max_n_ctx < alone.max_n_ctx
    widest = plan_memory(TARGET_7B, DRAFT_05B, small, n_ctx=with_copy.max_n_ctx)
    assert_within_budget(widest)
    with pytest.raises(MemoryPlanError):
        plan_memory(TARGET_7B, DRAFT_05B, small, n_ctx=with_copy.max_n_ctx + 256)


def plain_attention_grows_from(shape: ModelShape) -> int:
    """The first context (in 256s) at which fast loading on the CPU plans more than flash attention."""
    n_ctx = 256
    while (
        plan_memory(shape, None, cpu_only(512 * GIB), n_ctx=n_ctx, flash_attn=True).host_bytes
        == plan_memory(shape, None, cpu_only(512 * GIB), n_ctx=n_ctx).host_bytes
    ):
        n_ctx += 256
    return n_ctx


def test_4gib_gpu_takes_the_whole_draft_then_some_target_layers() -> None:
    p = plan(nvidia(4 * GIB, 32 * GIB))
    assert p.draft is not None and p.draft.all_on_gpu and p.draft.llama_gpu_layers == -1
    assert 0 < p.target.gpu_layers < TARGET_7B.n_layers and not p.target.all_on_gpu
    assert p.target.llama_gpu_layers == p.target.gpu_layers
    assert_within_budget(p)
    # One more target layer would not fit beside the draft.
    more = place(TARGET_7B, p.target.gpu_layers + 1, False, LoadSpec(4096))
    assert p.draft.gpu_bytes + more.gpu_bytes > p.gpu_budget


def test_8gib_gpu_takes_both_whole_and_caps_the_context() -> None:
    p = plan(nvidia(8 * GIB, 32 * GIB))
    assert p.draft is not None and p.draft.all_on_gpu and p.target.all_on_gpu
    assert p.target.llama_gpu_layers == -1
    assert 4096 < p.max_n_ctx < 32768 and p.max_n_ctx % CTX_STEP == 0
    assert_within_budget(plan(nvidia(8 * GIB, 32 * GIB), n_ctx=p.max_n_ctx))
    # The next step of context no longer fits this placement on the GPU.
    bigger = p.max_n_ctx + CTX_STEP
    gpu = sum(place(s, s.n_layers, True, LoadSpec(bigger)).gpu_bytes for s in (TARGET_7B, DRAFT_05B))
    assert gpu > p.gpu_budget


def test_24gib_gpu_fits_everything_at_the_training_context() -> None:
    p = plan(nvidia(24 * GIB, 64 * GIB))
    assert p.draft is not None and p.draft.all_on_gpu and p.target.all_on_gpu
    assert p.max_n_ctx == 32768
    assert plan(nvidia(24 * GIB, 64 * GIB), n_ctx=32768).max_n_ctx == 32768
    # With everything on the GPU, the host keeps the embeddings and the vocabulary.
    assert p.host_bytes < 0.6 * GIB


def test_16gb_mac_counts_gpu_and_host_in_one_ram() -> None:
    mac = apple(16 * GIB)
    p = plan(mac)
    assert p.target.all_on_gpu and p.draft is not None and p.draft.all_on_gpu
    assert p.gpu_budget == int(16 * GIB * 2 / 3)  # Metal's working set; no CUDA context to set aside
    assert_within_budget(p)
    # A 14B-sized target outgrows the working set: only some of its layers go to the GPU.
    big = shape("14b.gguf", 48, 210, embd_mib=400, head_mib=600, n_embd=5120, n_head_kv=8)
    q = plan_memory(big, DRAFT_05B, mac, n_ctx=4096)
    assert 0 < q.target.gpu_layers < 48
    assert_within_budget(q)


def test_a_draft_too_big_for_the_gpu_stays_whole_on_the_host() -> None:
    tiny_gpu = nvidia(GPU_RESERVE + 256 * MIB, 32 * GIB)
    p = plan(tiny_gpu)
    assert p.draft is not None and p.draft.gpu_layers == 0
    # ...and the target gets what little there is.
    assert p.target.gpu_layers > 0
    assert_within_budget(p)


def test_a_plan_that_cannot_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(MemoryPlanError, match=r"need \d+\.\d\d GiB of RAM.*but \d+\.\d\d GiB is free") as err:
        plan(cpu_only(4 * GIB))
    assert "7b.gguf and 0.5b.gguf at 4096 tokens of context" in err.value.message
    assert "try a smaller --ctx" in err.value.message
    # The target alone at a shorter context still does not fit 4 GiB with 1 GiB kept free.
    with pytest.raises(MemoryPlanError):
        plan(cpu_only(4 * GIB), n_ctx=512, draft=None)
    assert plan(cpu_only(6 * GIB), n_ctx=512, draft=None).draft is None


def test_kv_cache_arithmetic() -> None:
    # 8 KV heads x (128 + 128) x 2 bytes per token and layer.
    assert TARGET_7B.kv_bytes_per_layer(4096, "f16") == 4096 * 8 * 256 * 2
    assert TARGET_7B.kv_bytes_per_layer(4096, "q8_0") == 4096 * 8 * 256 * 34 // 32
    assert TARGET_7B.kv_bytes_per_layer(4096, "q4_0") == 4096 * 8 * 256 * 18 // 32
    # llama.cpp rounds the cache up to 256 cells.
    assert TARGET_7B.kv_bytes_per_layer(1000, "f16") == TARGET_7B.kv_bytes_per_layer(1024, "f16")
    smaller = plan(cpu_only(16 * GIB), n_ctx=16384)
    assert smaller.target.kv_bytes == 28 * 16384 * 8 * 256 * 2


def test_repacked_copies_count_for_host_layers_only() -> None:
    packed = dataclasses.replace(TARGET_7B, repack_bytes=28 * 100 * MIB)
    for layers in (0, 14, 28):
        with_copies = place(packed, layers, False, LoadSpec(4096, repack=True))
        without = place(packed, layers, False, LoadSpec(4096, repack=False))
        assert with_copies.host_bytes - without.host_bytes == (28 - layers) * 100 * MIB
        assert with_copies.gpu_bytes == without.gpu_bytes


def test_budgets_keep_room_for_the_cuda_context_and_the_os() -> None:
    assert budgets(nvidia(8 * GIB, 16 * GIB)) == (8 * GIB - GPU_RESERVE, 15 * GIB)
    assert budgets(cpu_only(16 * GIB))[0] == 0


# The real models: the arithmetic against what llama.cpp printed when it loaded them here
# ("CPU_Mapped model buffer size", "KV buffer size", "compute buffer size", in MiB).

LLAMA_CPP_LOG = {
    # fixture: (weights, KV at 4096 f16, compute buffer)
    "qwen_target": (1059.89, 112.0, 302.75),
    "qwen_draft": (462.96, 48.0, 300.25),
    "gemma": (235.16, 72.0, 514.5),
    "smollm": (92.10, 90.0, 98.25),
}


# The compute buffer llama.cpp reserved without flash attention (MiB), by context.
LLAMA_CPP_PLAIN_ATTENTION = {
    "qwen_target": {16384: 432.01, 32768: 848.01},
    "qwen_draft": {16384: 489.26, 32768: 969.26},
}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", sorted(LLAMA_CPP_LOG))
def test_sizes_match_llama_cpp(
    fixture: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    info = read_gguf_info(request.getfixturevalue(fixture), cache_dir=shared_cache(tmp_path_factory))
    s = ModelShape.from_info(info)
    weights, kv, compute = LLAMA_CPP_LOG[fixture]
    assert s.weight_bytes / MIB == pytest.approx(weights, abs=0.01)
    assert s.n_layers * s.kv_bytes_per_layer(4096, "f16") / MIB == pytest.approx(kv, abs=0.01)
    assert s.compute_reserved() / MIB == pytest.approx(compute, abs=0.01)
    for n_ctx, reserved in LLAMA_CPP_PLAIN_ATTENTION.get(fixture, {}).items():
        assert 0 <= s.plain_attention_resident(n_ctx) / MIB - reserved < 2.5  # never under it


@pytest.mark.slow
def test_qwen_q8_kv_matches_llama_cpp(qwen_target: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    s = ModelShape.from_info(read_gguf_info(qwen_target, cache_dir=shared_cache(tmp_path_factory)))
    assert s.n_layers * s.kv_bytes_per_layer(1024, "q8_0") / MIB == pytest.approx(14.88, abs=0.01)


PLAN_TOLERANCE = 0.15


@pytest.mark.slow
def test_planned_resident_memory_matches_rss_on_this_cpu(
    qwen_target: Path, qwen_draft: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Load the pair through localspec.backend in a fresh process; compare its RSS growth with the plan."""
    cache = shared_cache(tmp_path_factory)
    target = ModelShape.from_info(read_gguf_info(qwen_target, cache_dir=cache))
    draft = ModelShape.from_info(read_gguf_info(qwen_draft, cache_dir=cache))
    n_ctx, k = 4096, 4
    # Loaded with LoadOptions' defaults, as the probe loads them: repacked unless batch-invariant.
    repack = not LoadOptions().batch_invariant
    planned = plan_memory(target, draft, cpu_only(64 * GIB), n_ctx=n_ctx, k=k, repack=repack).host_bytes
    probe = Path(__file__).with_name("rss_probe.py")
    out = subprocess.run(
        [sys.executable, str(probe), str(qwen_target), str(qwen_draft), str(n_ctx), "f16", str(k)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    used = rss["generated"] - rss["before"]
    print(f"planned {planned / MIB:.1f} MiB, RSS growth {used / MIB:.1f} MiB ({planned / used - 1:+.1%})")
    assert abs(planned - used) <= PLAN_TOLERANCE * used
