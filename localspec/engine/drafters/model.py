"""A draft model, or the target's own first layers, drafting token by token with its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from localspec.engine.drafters.base import Draft, KeepFn, common_prefix
from localspec.engine.llama import LlamaModel
from localspec.engine.sampling import Dist, distribution, sample
from localspec.types import SamplingParams


class ModelDrafter:
    """A smaller model (or the target's own first layers) drafting token by token.

    It keeps its KV cache in step with the accepted tokens: each call feeds only
    what it has not seen, after rolling back what the target rejected.
    """

    def __init__(self, model: LlamaModel, name: str = "draft", min_confidence: float = 0.0) -> None:
        self.model = model
        self.name = name
        self.min_confidence = min_confidence
        self._seen: list[int] = []

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        if fresh:
            self.model.reset()
            self._seen = []

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        return self._propose(tokens, k, params, rng, None)

    def propose_while(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        keep: KeepFn,
    ) -> Draft:
        """As `propose`, but `keep(i, confidence)` decides whether the i-th drafted token is kept.

        Drafting stops at the first token it refuses (min_confidence is not used). Confidence is
        the top probability of the draft's distribution there (its greedy token's), so the caller
        can stop where a verify stops paying, without looking at which token a sample drew.
        """
        return self._propose(tokens, k, params, rng, keep)

    def lag(self, tokens: Sequence[int]) -> int:
        """How many tokens the next proposal must feed before its first draft (its catch-up)."""
        return max(1, len(tokens) - common_prefix(self._seen, tokens))

    def _propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        rng: np.random.Generator,
        keep: KeepFn | None,
    ) -> Draft:
        draft = Draft()
        k = min(k, self.model.n_ctx - len(tokens) - 1)
        if k <= 0:
            return draft
        common = common_prefix(self._seen, tokens)
        if common == len(tokens):
            common -= 1  # the last token must be decoded again to get its logits
        self.model.truncate(common)
        del self._seen[common:]
        feed = list(tokens[common:])
        for _ in range(k):
            draft.seconds += self.model.decode(feed, 1)
            self._seen.extend(feed)
            logits = self.model.logits(-1)
            if keep is None:
                token, q, confident = self._choose(logits, params, rng)
            else:
                token, q, confidence = _pick_with_confidence(logits, params, rng)
                confident = keep(len(draft.tokens), confidence)
            if not confident:
                break
            draft.tokens.append(token)
            draft.probs.append(q)
            feed = [token]
        return draft

    def _choose(
        self, logits: npt.NDArray[np.float32], params: SamplingParams, rng: np.random.Generator
    ) -> tuple[int, Dist | None, bool]:
        if params.greedy:
            token = int(logits.argmax())
            if self.min_confidence <= 0.0:
                return token, None, True
            top = float(logits[token])
            confidence = 1.0 / float(np.exp(logits.astype(np.float64) - top).sum())
            return token, None, confidence >= self.min_confidence
        q = distribution(logits, params)
        token = sample(q, rng)
        # The distribution's top probability, not the drawn token's: whether a token is kept must not
        # depend on which token was drawn, or the kept ones no longer follow q (rejection sampling).
        return token, q, q.top() >= self.min_confidence


def _pick_with_confidence(
    logits: npt.NDArray[np.float32], params: SamplingParams, rng: np.random.Generator
) -> tuple[int, Dist | None, float]:
    # Confidence is the draft distribution's top probability, never the drawn token's: keeping a
    # sampled token depending on which token was drawn would skew what rejection sampling
    # proposes, and the output would no longer follow the target's distribution.
    if params.greedy:
        token = int(logits.argmax())
        # float32 is plenty for a stopping rule and several times cheaper than float64 over the vocabulary.
        return token, None, 1.0 / float(np.exp(logits - logits[token]).sum())
    q = distribution(logits, params)
    return sample(q, rng), q, q.top()
