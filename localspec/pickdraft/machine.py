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
from localspec.pickdraft.rank import Choice, PickResult, choose, pick_draft


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


def choose_for_machine(
    target: Path,
    *,
    n_ctx: int = 4096,
    kv_type: str = "f16",
    repack: bool | None = None,
    draft_only: bool = False,
    cache_dir: Path | None = None,
) -> tuple[Choice, bool]:
    """pick-draft's choice for `target` on this machine, and whether it was the one saved earlier.

    The choice saved for this target and machine (pickdraft.saved) while nothing it depends
    on has changed; else a fresh fast-path pick, saved. `draft_only`: the person asked for a
    draft model, so the fastest usable one wins, even where it is not expected to pay.
    """
    from localspec.pickdraft.devices import detect_memory
    from localspec.pickdraft.saved import load_choice, pick_key, save_choice

    cache = cache_dir or Paths.from_env().cache_dir
    plan = {"n_ctx": n_ctx, "kv_type": kv_type, "repack": repack, "draft_only": draft_only}
    key = pick_key(target, detect_memory(), plan, cache)
    saved = load_choice(cache, key)
    if saved is not None:
        return saved, True
    result = pick_for_machine(target, n_ctx=n_ctx, kv_type=kv_type, repack=repack)
    choice = result.choice
    if draft_only and choice.method != "draft":
        drafts = [c for c in result.candidates if c.usable and c.method == "draft"]
        choice = choose(drafts) if drafts else choice
    save_choice(cache, key, choice)
    return choice, False
