"""Pick-draft for this machine: its memory, and the decode curves already measured on it.

Apart from `rank` (pure planning over given numbers) and `measure` (which loads
models), so neither imports the other and ranking never imports llama.cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from localspec.auto.costmodel import Curve
from localspec.engine.config import LoadOptions
from localspec.paths import Paths
from localspec.pickdraft.rank import PickResult, pick_draft


def cached_curves(result: PickResult, cache_dir: Path | None = None) -> dict[Path, Curve]:
    """Decode curves already measured on this machine for the target and the usable drafts, by path,
    loaded as the result was planned (exact, or `--fast`)."""
    from localspec.auto.calibrate import calibration_key, load_cached

    cache = cache_dir or Paths.from_env().cache_dir
    out: dict[Path, Curve] = {}
    for cand in result.candidates:
        if not cand.usable or cand.plan is None:
            continue
        plan = cand.plan
        options = LoadOptions(
            kv_type=plan.kv_type, gpu_layers=plan.target.llama_gpu_layers, batch_invariant=not result.repack
        )
        files = [(result.target.path, options)]
        if cand.method == "draft" and cand.path is not None and plan.draft is not None:
            files.append((cand.path, replace(options, gpu_layers=plan.draft.llama_gpu_layers)))
        for path, opts in files:
            curve = out.get(path) or load_cached(cache, calibration_key(path, opts))
            if curve is not None:
                out[path] = curve
    return out


def pick_for_machine(
    target: Path,
    *,
    search_paths: Sequence[Path] = (),
    n_ctx: int = 4096,
    kv_type: str = "f16",
    vram: int | None = None,
    ram: int | None = None,
    repack: bool | None = None,
) -> PickResult:
    """The fast path `serve`, `chat` and `pick-draft` use: this machine's memory (or the overrides),
    and the decode curves the auto policy or `--measure` cached here, where they exist.

    `repack` None plans for LoadOptions' default (exact); True for `--fast` loading."""
    from localspec.pickdraft.devices import detect_memory

    device = detect_memory(vram, ram)
    pick = partial(pick_draft, target, device, search_paths=search_paths, n_ctx=n_ctx, kv_type=kv_type)
    result = pick(repack=repack)
    if vram is not None or ram is not None:
        return result  # curves measured here say nothing about the machine being planned for
    curves = cached_curves(result)
    if not curves:
        return result
    return pick(repack=repack, curves=curves)
