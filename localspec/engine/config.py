"""What the engine loads and how: plain settings, built at the edge, that import no llama.cpp.

`resolve`, pick-draft and the daemon build these without loading a model, so this
module stays light; `engine.llama` and `engine.worker` read them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from localspec.engine.drafters.base import DRAFT_MIN_CONFIDENCE
from localspec.types import Method


def default_threads() -> int:
    import psutil

    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


@dataclass(frozen=True)
class LoadOptions:
    """How to load one model. gpu_layers: None = all when offload is supported, -1 = all, 0 = CPU.

    batch_invariant (on by default) turns off weight repacking and forces flash attention, which
    makes small batched verifies round like one-token decoding on the CPU (scripts/batch_rounding.py).
    With repacking on, greedy speculative output differed from the target alone on 4 of the 8
    bench prompts on Qwen2.5-Coder-1.5B; with it off, on none. Off (`--fast`), verifies batch
    better and output is identical only up to float rounding, as in llama.cpp's own speculation.
    """

    n_ctx: int = 4096
    n_threads: int | None = None
    gpu_layers: int | None = None
    kv_type: str = "f16"
    n_batch: int = 512
    batch_invariant: bool = True


# The largest batch that rounds exactly like one-token decoding with batch_invariant loading on the
# CPU (llama.cpp as vendored by llama-cpp-python 0.3.36, Q4_K_M weights). Measured on the Qwen2.5-Coder
# pair: fixed n-gram drafting with k <= 6 (verify batches of <= 7) stayed token-identical to the target
# alone on all 8 bench prompts at 128 tokens; k = 7 and 8 (batches of 8, 9) diverged on two of them, at
# tokens 15 and 50, at positions the near-tie re-decide does not catch. See docs/benchmarks.md.
EXACT_VERIFY_BATCH = 7


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
