"""Speed figures of one reply as it streams, from chunk arrival times: pure, testable on numbers.

The daemon's own stats (GenerationStats) arrive only with the last chunk; until
then the stats bar shows what the client measures: tokens per second over the
last second and since the first token, time to first token, and the share of
tokens that came from accepted drafts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localspec.types import GenerationStats, PromptProgress

WINDOW_S = 1.0  # "tokens/s now" is measured over the last second
BUCKET_S = 0.1  # one sparkline point per tenth of a second


@dataclass
class LiveStats:
    """Figures for one reply; times are monotonic seconds, `started` when the request was sent."""

    started: float
    tokens: int = 0
    from_draft: int = 0
    first_at: float | None = None
    last_at: float | None = None
    final: GenerationStats | None = None
    reading: PromptProgress | None = None  # how far the prompt's read has got, before the first token
    _recent: deque[tuple[float, int]] = field(default_factory=deque)
    _buckets: list[int] = field(default_factory=list)

    def add(self, n_tokens: int, from_draft: int, at: float) -> None:
        if n_tokens <= 0:
            return
        if self.first_at is None:
            self.first_at = at
        self.last_at = at
        self.tokens += n_tokens
        self.from_draft += from_draft
        self._recent.append((at, n_tokens))
        while self._recent and self._recent[0][0] < at - WINDOW_S:
            self._recent.popleft()
        index = int((at - self.first_at) / BUCKET_S)
        self._buckets.extend([0] * (index + 1 - len(self._buckets)))
        self._buckets[index] += n_tokens

    def finish(self, stats: GenerationStats) -> None:
        self.final = stats

    @property
    def ttft_s(self) -> float | None:
        if self.final is not None:
            return self.final.ttft_s
        return None if self.first_at is None else self.first_at - self.started

    def tokens_per_second_now(self, now: float) -> float:
        """Over the last WINDOW_S (less at the start of the reply); 0 once the stream has paused."""
        if self.first_at is None:
            return 0.0
        recent = sum(n for t, n in self._recent if t >= now - WINDOW_S)
        span = min(WINDOW_S, max(now - self.first_at, BUCKET_S))
        return recent / span

    def tokens_per_second_avg(self) -> float:
        """The daemon's figure once it has sent it, else tokens after the first over the time since."""
        if self.final is not None:
            return self.final.tokens_per_second
        if self.first_at is None or self.last_at is None or self.last_at <= self.first_at:
            return 0.0
        return (self.tokens - 1) / (self.last_at - self.first_at)

    @property
    def draft_share(self) -> float:
        """Tokens that came from accepted drafts, as a share of all tokens so far."""
        return self.from_draft / self.tokens if self.tokens else 0.0

    def series(self) -> list[float]:
        """Tokens/s in each BUCKET_S since the first token, for the sparkline."""
        return [n / BUCKET_S for n in self._buckets]
