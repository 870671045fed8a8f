"""Prompts read with plain weights, replies generated with repacked ones: the faster layout for each.

llama.cpp repacks weights for its CPU kernels, which makes one-token decoding and short verifies
fast; on the 2-core AVX-512 machine it also makes prompt evaluation slow: 152-160 prompt tok/s
against 242-246 with the file's own layout (docs/benchmarks.md), for llama-server too. A second
load of the same file without repacking (its weights are the file's pages, mmap'd and shared with
the page cache: no second copy in anonymous memory) reads inputs of PREFILL_MIN tokens or more,
and the repacked model takes the cache it fills over (LlamaModel.attach_prefill): the same
positions, their values up to float rounding, as any other batch size's. Whether it pays depends
on the CPU, so it is measured once per machine and model and cached next to the calibration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from localspec.engine.config import PLAIN_CONTEXT, flash_attention
from localspec.engine.llama import LlamaModel, gpu_offload_supported

MEASURE_TOKENS = 192
ROUNDS = 2
# The plain layout must read prompts this much faster to be worth its memory (its KV cache and
# compute buffers, and the file's pages kept in memory).
WORTH = 1.1


def attach_plain_prefill(
    model: LlamaModel, cache_dir: Path, progress: Callable[[float], None] | None = None
) -> str | None:
    """Attach a plain copy of `model`'s weights for reading prompts where that is faster here.

    `model.options.plain_prefill`: True attaches it, False never, None where measured (or cached)
    at least WORTH times faster. Returns one line on what was decided and why, or None where the
    question does not arise (exact loading, no repacking, layers on a GPU or RPC workers).
    `progress` hears the measurement's fraction done, where one runs.
    """
    options = model.options
    # Layers on RPC workers: a second copy would load onto them too, and their prompt reads pay the
    # network's round trips, not the layout's.
    if options.plain_prefill is False or model.exact or not model.repack or options.rpc or _on_gpu(model):
        return None
    plain: LlamaModel | None = None
    line = "prompts read with plain weights (as set)"
    if options.plain_prefill is None:
        key = _speeds_key(model)
        speeds, how = _cached_speeds(cache_dir, key), "cached"
        if speeds is None:  # only a measurement needs the copy before the answer is known
            report = progress or (lambda _fraction: None)
            report(0.0)
            plain = _plain_copy(model)
            speeds = _measure(model, plain, cache_dir, key, report)
            how = f"measured on {MEASURE_TOKENS} tokens"
        speedup = speeds[0] / speeds[1]
        if speedup < WORTH:
            if plain is not None:
                plain.close()
            return f"prompts read with repacked weights: the plain layout is {speedup:.2f}x here ({how})"
        line = f"prompts read with plain weights: {speedup:.2f}x faster than repacked here ({how})"
    model.attach_prefill(plain or _plain_copy(model))
    return line


def _plain_copy(model: LlamaModel) -> LlamaModel:
    """The copy, its context at most PLAIN_CONTEXT to begin with (it grows where a read needs more:
    LlamaModel._prefill_holds), with the model's attention, chosen for the model's context: a cache
    is handed over only between contexts of one layout (engine.config.flash_attention)."""
    options = replace(
        model.options,
        plain_prefill=False,
        n_ctx=min(model.n_ctx, PLAIN_CONTEXT),
        flash_attn=flash_attention(model.options, model.on_gpu),
    )
    return LlamaModel(model.path, options, repack=False)


def _on_gpu(model: LlamaModel) -> bool:
    gpu = model.options.gpu_layers
    return gpu_offload_supported() and gpu != 0


def _speeds_key(model: LlamaModel) -> dict[str, Any]:
    from localspec.auto.calibrate import calibration_key

    return {**calibration_key(model.path, model.options, ()), "prefill_tokens": MEASURE_TOKENS}


def _cached_speeds(cache_dir: Path, key: dict[str, Any]) -> tuple[float, float] | None:
    """Seconds to read MEASURE_TOKENS prompt tokens, repacked and plain, as measured on an earlier load."""
    from localspec.auto.calibrate import load_cached

    cached = load_cached(cache_dir, key)
    return (cached.seconds[0], cached.seconds[1]) if cached is not None and len(cached.seconds) == 2 else None


def _measure(
    model: LlamaModel,
    plain: LlamaModel,
    cache_dir: Path,
    key: dict[str, Any],
    report: Callable[[float], None],
) -> tuple[float, float]:
    """Seconds to read MEASURE_TOKENS prompt tokens, repacked and plain, measured now (and cached).

    Reports after each read: ~5 s each for a 1.5B on 2 slow cores, 20 s in all at a daemon's start.
    """
    from localspec.auto.calibrate import _tokens, store
    from localspec.auto.costmodel import Curve
    from localspec.errors import StorageError

    tokens = _tokens(model, MEASURE_TOKENS)
    best = [float("inf"), float("inf")]
    for r in range(ROUNDS):  # in turns, so a burst of other load hits both
        for i, m in enumerate((model, plain)):
            m.reset()
            best[i] = min(best[i], m.decode(tokens, 1))
            m.reset()
            report((2 * r + i + 1) / (2 * ROUNDS))
    with contextlib.suppress(StorageError):  # not saved: measured again next load
        store(cache_dir, key, Curve((best[0], best[1])))
    return best[0], best[1]
