"""Drafters propose the next few tokens cheaply; the target then verifies them in one batch.

The seam is small on purpose (as llama-cpp-python's `LlamaDraftModel`): given the
accepted tokens so far, return up to k token ids and, for sampled drafts, the
distribution each was drawn from. A drafter never touches the target's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from localspec.backend import LlamaModel
from localspec.ngram import NgramIndex, NgramMatch
from localspec.sampling import probabilities, sample
from localspec.types import SamplingParams

KeepFn = Callable[[int, float], bool]


@dataclass
class Draft:
    """Proposed tokens; `probs[i]` is q for token i (None: a deterministic proposal)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[npt.NDArray[np.float64] | None] = field(default_factory=list)
    seconds: float = 0.0
    evidence: int = 0


class Drafter(Protocol):
    name: str

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        """A new request begins with these prompt tokens.

        `fresh` drops what earlier requests left; otherwise (the request reuses the last one's
        KV cache) `propose` finds what the drafter's state shares with the new tokens.
        """

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        """Up to k tokens to follow `tokens` (every accepted token, the last one included)."""
        ...


# A fixed n-gram method drafts only on a convincing match: the context's last 5+ tokens seen before.
# Shorter matches are mostly wrong off copied text, and each costs a batched verify (2.25 tokens for
# 4 on the 2-core CPU). Replayed over the 8 bench traces: min 2 ran at 0.79-0.97x of plain decoding
# where nothing is copied; min 5 never below 1.00x, and 1.42x on the rename (2: 1.46x).
NGRAM_MIN_MATCH = 5
NGRAM_MAX_MATCH = 8
# A fixed draft model stops drafting once its own top probability falls under this: on prose its
# unconfident guesses are mostly rejected (replayed: 0.38x of plain decoding at k=4 without a floor,
# 0.70x with it; code 0.81x and 0.87x).
DRAFT_MIN_CONFIDENCE = 0.75


class NgramDrafter:
    """Prompt lookup: copy what followed the longest recent match of the context's tail."""

    name = "ngram"

    def __init__(self, min_n: int = NGRAM_MIN_MATCH, max_n: int = NGRAM_MAX_MATCH) -> None:
        self._min_n, self._max_n = min_n, max_n
        self._index = NgramIndex(min_n, max_n)

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        self._index = NgramIndex(self._min_n, self._max_n)
        self._index.extend(prompt)

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        match = self.peek(tokens, k)
        return Draft(match.tokens, [None] * len(match.tokens), evidence=match.match_len)

    def peek(self, tokens: Sequence[int], k: int) -> NgramMatch:
        """What `propose` would draft now (the same tokens, as a prefix for a smaller k), at no cost.

        The auto policy looks before it chooses: a long match is worth a verify, a short one seldom.
        """
        known = len(self._index.tokens)
        if tokens[:known] != self._index.tokens:
            self.start(tokens)
        else:
            self._index.extend(tokens[known:])
        return self._index.propose(k)


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
    ) -> tuple[int, npt.NDArray[np.float64] | None, bool]:
        if params.greedy:
            token = int(logits.argmax())
            if self.min_confidence <= 0.0:
                return token, None, True
            top = float(logits[token])
            confidence = 1.0 / float(np.exp(logits.astype(np.float64) - top).sum())
            return token, None, confidence >= self.min_confidence
        q = probabilities(logits, params)
        token = sample(q, rng)
        # The distribution's top probability, not the drawn token's: whether a token is kept must not
        # depend on which token was drawn, or the kept ones no longer follow q (rejection sampling).
        return token, q, float(q.max()) >= self.min_confidence


def _pick_with_confidence(
    logits: npt.NDArray[np.float32], params: SamplingParams, rng: np.random.Generator
) -> tuple[int, npt.NDArray[np.float64] | None, float]:
    # Confidence is the draft distribution's top probability, never the drawn token's: keeping a
    # sampled token depending on which token was drawn would skew what rejection sampling
    # proposes, and the output would no longer follow the target's distribution.
    if params.greedy:
        token = int(logits.argmax())
        # float32 is plenty for a stopping rule and several times cheaper than float64 over the vocabulary.
        return token, None, 1.0 / float(np.exp(logits - logits[token]).sum())
    q = probabilities(logits, params)
    return sample(q, rng), q, float(q.max())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest shared prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
