"""pick-draft: find every draft this target could use, check it, plan its memory, rank by expected speed.

Candidates: every GGUF that discovery finds (plus extra search paths), the
self-speculative methods (`ngram`, `layerskip`) and `none`; when no local model
fits, the catalog's known drafts with the `localspec pull` command that fetches them.
Each gets a verdict with its reason: tokenizer compatibility by llama.cpp's rule
(`compat`), a memory plan (`memplan`), and an expected speedup from the auto
controller's cost model, fed with this machine's calibrated decode curves where
they are cached (by the daemon's auto policy or `--measure`) and with priors
otherwise (`cost`). The fast path loads no model: serve and chat use it
when started with a target and no draft.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from localspec.auto.costmodel import DRAFT_PRIOR, Curve
from localspec.errors import LocalspecError
from localspec.models.compat import check_compat
from localspec.models.discovery import FoundModel, discover
from localspec.models.gguf_info import GGUFInfo, read_gguf_info
from localspec.paths import Paths
from localspec.pickdraft.cost import LAYERSKIP_ACCEPTANCE, Costs, Estimate, k_max
from localspec.pickdraft.devices import GIB, DeviceMemory
from localspec.pickdraft.memplan import MemoryPlan, MemoryPlanError, ModelShape, plan_memory

if TYPE_CHECKING:
    from localspec.settings import Settings

ChoiceMethod = Literal["draft", "ngram", "layerskip", "none"]


@dataclass(frozen=True)
class Candidate:
    """One way to speculate for the target, with its verdict and the reason for it."""

    method: ChoiceMethod
    label: str
    path: Path | None
    source: str
    compatible: bool
    fits: bool
    reason: str
    estimate: Estimate | None = None
    plan: MemoryPlan | None = None
    pull: str | None = None

    @property
    def usable(self) -> bool:
        """Compatible, fitting and on disk (or needing no file)."""
        return self.compatible and self.fits and self.pull is None

    @property
    def expected_speedup(self) -> float | None:
        return round(self.estimate.speedup, 3) if self.estimate else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "label": self.label,
            "path": str(self.path) if self.path else None,
            "source": self.source,
            "compatible": self.compatible,
            "fits": self.fits,
            "reason": self.reason,
            "expected_speedup": self.expected_speedup,
            "k": self.estimate.k if self.estimate else None,
            "measured": bool(self.estimate and self.estimate.measured),
            "pull": self.pull,
        }


# The settings a saved choice sets that ranking does not read (it reads target and n_ctx).
CHOICE_KEYS = frozenset(("method", "draft", "k", "gpu_layers", "draft_gpu_layers"))


@dataclass(frozen=True)
class Choice:
    """What serve and chat load: the settings pick-draft recommends, and why."""

    method: ChoiceMethod
    draft: Path | None
    k: int
    gpu_layers: int
    draft_gpu_layers: int | None
    n_ctx: int
    expected_speedup: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "draft": str(self.draft) if self.draft else None,
            "k": self.k,
            "gpu_layers": self.gpu_layers,
            "draft_gpu_layers": self.draft_gpu_layers,
            "n_ctx": self.n_ctx,
            "expected_speedup": round(self.expected_speedup, 3),
            "reason": self.reason,
        }

    def settings_values(self, target: Path) -> dict[str, Any]:
        """The keys `settings.save_settings` writes to config.toml: what serve runs given this choice
        and no config (`apply_choice`), so that saving it changes nothing but keeps it. Where `auto`
        runs the choice it saves `auto` with the choice's draft: a saved `none` would lose auto's
        copies on code edits (2.4x of none here), a saved `draft` would draft at every step where auto
        stops while the draft is wrong."""
        values = {
            key: value for key, value in self.to_dict().items() if key not in ("expected_speedup", "reason")
        }
        if self.method in AUTO_CHOOSES:
            values["method"] = "auto"
        # No cap where nothing is drafted (a saved 0 fails the settings' k >= 1), nor for auto, which
        # chooses its own k (apply_choice gives the choice's k to the choice's method only): None
        # removes an older one (settings.save_settings).
        if self.k < 1 or values["method"] != self.method:
            values["k"] = None
        return {"target": str(target), **values}


@dataclass(frozen=True)
class PickResult:
    target: GGUFInfo
    device: DeviceMemory
    candidates: list[Candidate]
    choice: Choice
    # Planned for repacked weights (`--fast` loading) rather than exact verifies.
    repack: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": str(self.target.path),
            "device": self.device.describe(),
            "exact": not self.repack,
            "choice": self.choice.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }


def pick_draft(
    target: Path,
    device: DeviceMemory,
    *,
    search_paths: Sequence[Path] = (),
    n_ctx: int = 4096,
    kv_type: str = "f16",
    repack: bool | None = None,
    env: Mapping[str, str] | None = None,
    curves: Mapping[Path, Curve] | None = None,
) -> PickResult:
    """The fast path (no model is loaded): every candidate checked, planned, estimated and ranked.

    `repack` None plans for LoadOptions' default; `curves` holds measured decode curves
    by model path (seconds for n = 1..); models without one are costed from priors.
    """
    env = os.environ if env is None else env
    cache_dir = Paths.from_env(env).cache_dir
    if repack is None:
        from localspec.engine.config import LoadOptions

        repack = not LoadOptions().batch_invariant
    machine = _Machine(device, n_ctx, kv_type, repack)
    info = read_gguf_info(target, cache_dir=cache_dir)
    shape = ModelShape.from_info(info)
    base = machine.plan(shape, None)  # refuses when the target alone cannot fit
    costs = Costs(shape, info.path, curves or {}, repack=repack)
    found = discover(search_paths, env=env, cache_dir=cache_dir)
    models = [m for m in found.models if not _same_file(m.info.path, info.path)]
    cands = [_model_candidate(info, m, machine, costs, cache_dir) for m in models]
    cands += _self_candidates(base, machine, costs)
    if not any(c.usable and c.method == "draft" for c in cands):
        cands += _catalog_candidates(info, {m.info.path.name for m in models}, base, costs)
    ranked = sorted(cands, key=rank_key)
    return PickResult(info, device, ranked, choose(ranked), repack)


@dataclass(frozen=True)
class _Machine:
    """What every candidate is planned against."""

    device: DeviceMemory
    n_ctx: int
    kv_type: str
    repack: bool

    def plan(self, target: ModelShape, draft: ModelShape | None) -> MemoryPlan:
        return plan_memory(
            target,
            draft,
            self.device,
            n_ctx=self.n_ctx,
            kv_type=self.kv_type,
            k=k_max(self.repack),
            repack=self.repack,
        )


# What `--method auto` chooses among at each step (the engine's auto policy): n-gram lookup, the loaded
# draft model, plain decoding. A choice outside these needs its own method.
AUTO_CHOOSES: frozenset[ChoiceMethod] = frozenset({"draft", "ngram", "none"})


def apply_choice(settings: Settings, choice: Choice) -> Settings:
    """`settings` with pick-draft's choice filling every field the person left unset.

    What serve and chat do when started with a target and no draft: values given by
    flag, LOCALSPEC_* or config.toml (pydantic's `model_fields_set`) are kept. An unset
    method stays `auto` where auto can run the choice (it chooses per step, and never runs
    slower than none); the choice's k goes with the choice's method.
    """
    given = settings.model_fields_set
    keep = "method" in given or choice.method in AUTO_CHOOSES
    method = settings.method if keep else choice.method
    update: dict[str, Any] = {
        "method": method,
        "draft": choice.draft,
        "k": choice.k if choice.k >= 1 and method == choice.method else None,
        "gpu_layers": choice.gpu_layers,
        "draft_gpu_layers": choice.draft_gpu_layers,
    }
    return settings.model_copy(update={k: v for k, v in update.items() if k not in given and v is not None})


# An n-gram estimate assumes the text repeats itself (NGRAM_MATCH_RATE of steps find a match); a
# draft model's does not. So where the two are this close, the draft model is the safer bet.
NGRAM_TIE_MARGIN = 0.03


def rank_key(c: Candidate) -> tuple[bool, float, str]:
    """Usable candidates first, fastest first."""
    return (not c.usable, -(c.estimate.speedup if c.estimate else 0.0), c.label)


def _prefer_model_draft(ranked: list[Candidate], best: Candidate) -> Candidate:
    """Within NGRAM_TIE_MARGIN of an n-gram winner, a usable draft model wins instead."""
    if best.method != "ngram" or best.estimate is None:
        return best
    for c in ranked:
        if c.method == "draft" and c.usable and c.estimate is not None:
            return c if c.estimate.speedup >= best.estimate.speedup - NGRAM_TIE_MARGIN else best
    return best


def choose(ranked: list[Candidate]) -> Choice:
    """The first usable candidate of a ranked list, as settings, with why it beat the best draft model."""
    best = _prefer_model_draft(ranked, next(c for c in ranked if c.usable))  # `none` always is
    assert best.plan is not None and best.estimate is not None
    plan = best.plan
    draft_layers = plan.draft.llama_gpu_layers if plan.draft else None
    if best.method == "none":
        reason = "nothing is expected to beat plain decoding here"
    else:
        reason = f"{best.label} {best.reason}"
    drafts = [c for c in ranked if c.usable and c.method == "draft" and c is not best]
    if best.method != "draft" and drafts:
        reason += f"; the draft {drafts[0].label} {drafts[0].reason}"
    return Choice(
        method=best.method,
        draft=best.path,
        k=best.estimate.k,
        gpu_layers=plan.target.llama_gpu_layers,
        draft_gpu_layers=draft_layers,
        n_ctx=plan.n_ctx,
        expected_speedup=best.estimate.speedup,
        reason=reason,
    )


# --- candidates ---------------------------------------------------------------------------------


def _model_candidate(
    target: GGUFInfo, found: FoundModel, machine: _Machine, costs: Costs, cache_dir: Path
) -> Candidate:
    # The path as found (a Hugging Face snapshot link, not the blob behind it) and the name `models` shows.
    label, path, draft = found.display_name, found.path, found.info
    try:
        verdict = check_compat(target, draft, cache_dir=cache_dir)
    except LocalspecError as exc:
        why = f"cannot check its tokenizer: {exc.message}"
        return Candidate("draft", label, path, "local", False, False, why)
    if not verdict.compatible:
        return Candidate("draft", label, path, "local", False, False, f"tokenizer differs: {verdict.reason}")
    shape = ModelShape.from_info(draft)
    try:
        plan = machine.plan(costs.target, shape)
    except MemoryPlanError as exc:
        return Candidate("draft", label, path, "local", True, False, f"does not fit: {exc.message}")
    est = costs.draft_model(shape, plan, DRAFT_PRIOR, path)
    return Candidate("draft", label, path, "local", True, True, describe(est, "draft"), est, plan)


def _self_candidates(base: MemoryPlan, machine: _Machine, costs: Costs) -> list[Candidate]:
    none = Estimate(1.0, 0, 0.0, 1.0, 0.0)
    ngram = costs.ngram(base)
    out = [
        Candidate("none", "none", None, "self", True, True, "plain decoding, the baseline", none, base),
        Candidate("ngram", "ngram", None, "self", True, True, describe(ngram, "ngram"), ngram, base),
    ]
    skip = layerskip_shape(costs.target)
    try:
        plan = machine.plan(costs.target, skip)
    except MemoryPlanError as exc:
        why = f"does not fit: {exc.message}"
        return [*out, Candidate("layerskip", "layerskip", None, "self", True, False, why)]
    est = costs.draft_model(skip, plan, LAYERSKIP_ACCEPTANCE, None)
    why = describe(est, "layerskip")
    return [*out, Candidate("layerskip", "layerskip", None, "self", True, True, why, est, plan)]


def layerskip_shape(target: ModelShape) -> ModelShape:
    """The derived draft `layerskip` writes: the kept blocks plus the target's embeddings and head."""
    from localspec.models.layerskip import default_keep

    keep = default_keep(target.n_layers)
    return replace(
        target,
        name=f"{target.name} (layerskip)",
        layer_bytes=tuple(target.layer_bytes[i] for i in keep),
        repack_bytes=target.repack_bytes * len(keep) // max(target.n_layers, 1),
    )


def _catalog_candidates(
    target: GGUFInfo, local_names: set[str], base: MemoryPlan, costs: Costs
) -> list[Candidate]:
    """Known drafts for this target that are not on disk; costed from their download size."""
    from localspec.models.catalog import load_catalog

    catalog = load_catalog()
    out = []
    for target_name, draft_name in catalog.pairs:
        known, draft = catalog.models[target_name], catalog.models[draft_name]
        if target.path.name not in (known.file, known.hf_file) or draft.file in local_names:
            continue
        ratio = draft.size_bytes / max(target.size_bytes, 1)
        est = costs.scaled_draft(ratio, base)
        gpu_room = base.gpu_budget - base.gpu_bytes
        host_room = base.host_budget - base.host_bytes
        fits = draft.size_bytes * 1.2 <= (gpu_room if base.device.has_gpu else 0) + host_room
        pull = f"localspec pull {draft.hf_repo}:{draft.hf_file}"
        reason = f"catalog pair, not downloaded ({draft.size_bytes / GIB:.2f} GiB): {pull}; " + describe(
            est, "draft"
        )
        out.append(Candidate("draft", draft.file, None, "catalog", True, fits, reason, est, None, pull))
    return out


def describe(est: Estimate, method: ChoiceMethod) -> str:
    """The reason line for a compatible, fitting candidate: what it costs, what it yields."""
    how = "measured" if est.measured else "prior"
    verify = f"verifying {est.k + 1} tokens costs {est.verify_cost:.2f}"
    if method == "ngram":
        head = f"copies from the context ({how}: acceptance {est.acceptance:.0%} when a match is found)"
    else:
        head = f"costs {est.draft_cost:.2f} of a target token here ({how} acceptance {est.acceptance:.0%})"
    verdict = f"{est.speedup:.2f}x at k={est.k}"
    if est.speedup < 1.0:
        verdict += ", slower than plain decoding"
    return f"{head}; {verify}; {verdict}"


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (a model is found by one name and asked for by another)."""
    try:
        return a.samefile(b)
    except OSError:
        return a == b
