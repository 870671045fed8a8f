"""The drafter seam: what every drafter proposes, and the few helpers they share.

The seam is small on purpose (as llama-cpp-python's `LlamaDraftModel`): given the
accepted tokens so far, return up to k token ids and, for sampled drafts, the
distribution each was drawn from. A drafter never touches the target's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from localspec.engine.sampling import Dist
from localspec.types import SamplingParams

KeepFn = Callable[[int, float], bool]


@dataclass
class Draft:
    """Proposed tokens; `probs[i]` is q for token i (None: a deterministic proposal)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[Dist | None] = field(default_factory=list)
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


# A fixed draft model stops drafting once its own top probability falls under this: on prose its
# unconfident guesses are mostly rejected (replayed: 0.38x of plain decoding at k=4 without a floor,
# 0.70x with it; code 0.81x and 0.87x).
DRAFT_MIN_CONFIDENCE = 0.75


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest shared prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
