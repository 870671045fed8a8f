"""The ways an engine drafts, and the policy each request runs with them.

The n-gram lookup (a drafter of its own per request, reading the cross-request memory), the draft
model (loaded with the target, where its file loads and its tokenizer matches), the layer-skip draft
(derived from the target on first use) and `auto` over them (its cost curves calibrated once per
machine). A method that cannot run falls back to `none`, with one line on why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.engine.config import EXACT_POSITIONS, EngineConfig
from localspec.engine.drafters.base import Drafter
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.drafters.ngram import NgramDrafter, NgramMemory
from localspec.engine.llama import LlamaModel
from localspec.engine.prompting import NO_FORMS, PromptForms, prompt_forms
from localspec.engine.speculative import FixedPolicy, Policy
from localspec.errors import LocalspecError, StorageError
from localspec.types import DEFAULT_K, GenerationRequest

if TYPE_CHECKING:
    from localspec.auto.policy import AutoPolicy, OnlineCosts

log = logging.getLogger("localspec.engine")

Folder = Callable[[Path | None, str], Path]  # a folder the config names, else a private one
Report = Callable[[str], Callable[[float], None] | None]  # progress for one named part of a load


class Methods:
    """The drafters of one loaded target. Runs on the engine's thread only."""

    def __init__(
        self,
        config: EngineConfig,
        target: LlamaModel,
        memory: NgramMemory,
        folder: Folder,
        report: Report,
        emptied: Callable[[], None],
    ) -> None:
        """`memory`: the n-gram memory across requests; `emptied` hears that calibration emptied the
        target's KV cache (nothing cached from earlier requests is left in it)."""
        self.config = config
        self._target = target
        self._memory = memory
        self._folder = folder
        self._report = report
        self._emptied = emptied
        self._ends = frozenset(target.eog_tokens())  # the target's end-of-generation tokens
        # The draft models loaded, by method (draft, layerskip); each request gets an n-gram drafter of
        # its own.
        self._drafters: dict[str, ModelDrafter] = {}
        self._layerskip_error: str | None = None
        self._auto_costs: OnlineCosts | None = None
        self.draft_error: str | None = None  # why the configured draft model did not load

    @property
    def names(self) -> list[str]:
        """The methods a request may name."""
        return ["none", "ngram", *(["draft"] if self.draft is not None else []), "layerskip", "auto"]

    @property
    def draft(self) -> ModelDrafter | None:
        """The draft model's drafter, where a draft model is loaded (its cache is saved and loaded
        with the target's)."""
        return self._drafters.get("draft")

    def models(self) -> list[LlamaModel]:
        """The draft models loaded (the draft, the layer-skip draft), for closing."""
        return [d.model for d in self._drafters.values()]

    def load_draft(self, path: Path) -> None:
        """Load the draft model at `path`; a failure of any kind leaves the target alone, with why."""
        from localspec.models.compat import check_compat
        from localspec.models.gguf_info import read_gguf_info

        cache = self._folder(self.config.cache_dir, "cache")
        try:
            target_info = read_gguf_info(self.config.target, cache_dir=cache)
            draft_info = read_gguf_info(path, cache_dir=cache)
            check_compat(target_info, draft_info, cache_dir=cache).raise_if_incompatible(
                self.config.target.name, path.name
            )
            drafter = self._load_drafter(path, "draft", "draft")
        except Exception as exc:
            # The target alone still serves every request; the stats say why there is no draft.
            # Any failure, not only the foreseen ones: a draft file must never take the daemon down.
            why = exc.message if isinstance(exc, LocalspecError) else f"{path}: {type(exc).__name__}: {exc}"
            self.draft_error = why
            log.warning("draft not loaded: %s", why)
            return
        self._drafters["draft"] = drafter

    def policy(
        self, req: GenerationRequest, prompt: Sequence[int], json_reply: bool = False
    ) -> tuple[Policy, str, int, str | None]:
        """A request's policy, method and k cap; a method that cannot run falls back to `none`, with why.
        `json_reply`: a grammar holds the reply to JSON (a schema, a tool call)."""
        spec = req.speculative
        method = spec.method
        ngram = method in ("auto", "ngram")
        if method != "none" and self._target.verify_limit(at=len(prompt)) < 2:
            # --exact where no verify of 2+ positions would round as one-token decoding: with layers
            # on a GPU at any position, on the CPU from EXACT_POSITIONS on.
            if self._target.on_gpu:
                where, why = "with layers on a GPU", "(no wider verify is bit-identical)"
                reason = f"{method} off: --exact {where} verifies one token at a time {why}"
            else:
                where = f"past position {EXACT_POSITIONS}"
                why = "(llama.cpp's attention rounds differently in batches there)"
                reason = f"{method} off: --exact verifies one token at a time {where} {why}"
            return FixedPolicy(None, 0), "none", 0, reason
        forms = prompt_forms(self._target, req, prompt, json_reply) if ngram else NO_FORMS
        if method == "auto":
            policy = self._auto_policy(spec.k, self._ngram(req, forms, auto=True))
            return policy, "auto", policy.k_max, None
        k = min(DEFAULT_K if spec.k is None else spec.k, self._k_limit())
        if method == "none":
            return FixedPolicy(None, 0), "none", 0, None
        if method == "layerskip":
            try:
                return FixedPolicy(self._layerskip(), k), method, k, None
            except LocalspecError as exc:
                return FixedPolicy(None, 0), "none", 0, f"layerskip unavailable: {exc.message}"
        drafter = self._ngram(req, forms) if method == "ngram" else self._drafters.get(method)
        if drafter is None:
            why = self.draft_error or "no draft model loaded (--draft FILE)"
            return FixedPolicy(None, 0), "none", 0, f"{method} unavailable: {why}"
        return FixedPolicy(drafter, k), method, k, None

    def calibrated(self) -> OnlineCosts:
        """The target's and draft's decode curves, measured once per machine (cached on disk)."""
        if self._auto_costs is None:
            from localspec.auto.calibrate import DRAFT_SIZES, calibrate
            from localspec.auto.costmodel import Curve
            from localspec.auto.policy import OnlineCosts

            cache = self._folder(self.config.cache_dir, "cache")
            draft = self.draft
            try:
                measured = calibrate(self._target, cache, progress=self._report("calibration"))
                verify, draft_curve = measured.curve, None
                if draft is not None:
                    measured = calibrate(
                        draft.model, cache, sizes=DRAFT_SIZES, progress=self._report("draft calibration")
                    )
                    draft_curve = measured.curve
                if measured.not_saved is not None:
                    log.warning("calibration not saved (measured again next start): %s", measured.not_saved)
            except Exception as exc:  # auto must still serve: assume batching gains nothing
                log.warning("calibration failed, auto will decode plainly: %s", exc)
                verify, draft_curve = Curve.linear(0.03), None
            # Calibrating emptied both KV caches: nothing cached from earlier requests is left.
            self._emptied()
            if draft is not None:
                draft.start((), fresh=True)
            self._auto_costs = OnlineCosts(verify, draft_curve)
        return self._auto_costs

    def _layerskip(self) -> Drafter:
        if self._layerskip_error is not None:
            raise LocalspecError(self._layerskip_error)
        if "layerskip" not in self._drafters:
            from localspec.models.layerskip import derive_layerskip_draft

            derived = self._folder(self.config.derived_dir, "derived")
            try:
                path = derive_layerskip_draft(self.config.target, cache_dir=derived)
            except StorageError as exc:
                # Deriving hashes and copies the whole target: not again on every request (restart to retry).
                self._layerskip_error = exc.message
                raise
            self._drafters["layerskip"] = self._load_drafter(path, "layerskip", "layerskip draft")
        return self._drafters["layerskip"]

    def _load_drafter(self, path: Path, name: str, label: str) -> ModelDrafter:
        """A draft model loaded as the settings place drafts (its own GPU layers, never on RPC workers);
        `label` names it in the load's progress."""
        options = replace(self.config.load, gpu_layers=self.config.draft_gpu_layers, rpc=())
        model = LlamaModel(path, options, self._report(label))
        return ModelDrafter(model, name, self.config.draft_min_confidence)

    def _ngram(
        self, req: GenerationRequest, forms: PromptForms = NO_FORMS, auto: bool = False
    ) -> NgramDrafter:
        """A request's n-gram drafter, reading earlier requests' text unless a seed must reproduce it:
        sampled output depends on what was drafted, and memory changes from one request to the next.
        `forms`: the prompt's other forms a reply may copy (`prompt_forms`)."""
        seeded = not req.sampling.greedy and req.sampling.seed is not None
        memory = None if seeded else self._memory
        # The tokens' text tells the copy cursor the forms of one name apart (` lo`, `(lo`), and
        # auto where a chat reply (Markdown) is in prose; a raw completion's text is not Markdown.
        text = self._target.piece_text
        if auto:
            return NgramDrafter.for_auto(
                memory, text, bool(req.messages) or req.chat, self._ends, forms.views, forms.skipped
            )
        return NgramDrafter(
            memory=memory, text=text, ends=self._ends, views=forms.views, skipped=forms.skipped
        )

    def _auto_policy(self, k: int | None, ngram: NgramDrafter) -> AutoPolicy:
        from localspec.auto.costmodel import NGRAM_K_MAX
        from localspec.auto.policy import NEAR_TIE_PRIOR, AutoPolicy

        # Its own n-gram lookup (NgramDrafter.for_auto): the match length is the evidence auto weighs.
        return AutoPolicy(
            self.calibrated(),
            ngram,
            self.draft,
            k_max=min(NGRAM_K_MAX if k is None else k, self._k_limit()),
            # Only --exact re-decides near-ties; elsewhere a prior for them only shortens drafts.
            near_tie_prior=NEAR_TIE_PRIOR if self._target.exact else 0.0,
        )

    def _k_limit(self) -> int:
        """The most tokens a step may draft: its verify batch (k + 1) must round like one-token decoding."""
        return self._target.max_verify_batch - 1
