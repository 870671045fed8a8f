"""Drafters propose the next few tokens cheaply; the target then verifies them in one batch.

The seam is small on purpose (as llama-cpp-python's `LlamaDraftModel`): given the
accepted tokens so far, return up to k token ids and, for sampled drafts, the
distribution each was drawn from. A drafter never touches the target's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from localspec.backend import LlamaModel
from localspec.ngram import NgramIndex
from localspec.sampling import probabilities, sample
from localspec.types import SamplingParams


@dataclass
class Draft:
    """Proposed tokens; `probs[i]` is q for token i (None: a deterministic proposal)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[npt.NDArray[np.float64] | None] = field(default_factory=list)
    seconds: float = 0.0
    evidence: int = 0


class Drafter(Protocol):
    name: str

    def start(self, prompt: Sequence[int]) -> None:
        """A new request begins with these prompt tokens."""

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        """Up to k tokens to follow `tokens` (every accepted token, the last one included)."""
        ...


class NgramDrafter:
    """Prompt lookup: copy what followed the longest recent match of the context's tail."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        self._min_n, self._max_n = min_n, max_n
        self._index = NgramIndex(min_n, max_n)

    def start(self, prompt: Sequence[int]) -> None:
        self._index = NgramIndex(self._min_n, self._max_n)
        self._index.extend(prompt)

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        known = len(self._index.tokens)
        if tokens[:known] != self._index.tokens:
            self.start(tokens)
        else:
            self._index.extend(tokens[known:])
        match = self._index.propose(k)
        return Draft(match.tokens, [None] * len(match.tokens), evidence=match.match_len)


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

    def start(self, prompt: Sequence[int]) -> None:
        self.model.reset()
        self._seen = []

    def propose(
        self, tokens: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        draft = Draft()
        k = min(k, self.model.n_ctx - len(tokens) - 1)
        if k <= 0:
            return draft
        common = _common_prefix(self._seen, tokens)
        if common == len(tokens):
            common -= 1  # the last token must be decoded again to get its logits
        self.model.truncate(common)
        del self._seen[common:]
        feed = list(tokens[common:])
        for _ in range(k):
            draft.seconds += self.model.decode(feed, 1)
            self._seen.extend(feed)
            logits = self.model.logits(-1)
            token, q, confident = self._choose(logits, params, rng)
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
        return token, q, float(q[token]) >= self.min_confidence


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
