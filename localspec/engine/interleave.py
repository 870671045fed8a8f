"""Requests to one model in turns: a short one does not wait for a long reply, nor a reply for another.

One model, one KV sequence, one request at a time: an editor's fill-in-the-middle completion sent
while an agent writes a 1,000-token edit waited for the whole edit (30 s and more on a CPU), and a
chat's reply for the agent's. llama-server serves such requests side by side in parallel slots.
Here the engine's worker runs them in turns: at a turn's end, between two steps of a reply or two of
llama.cpp's chunks of its prompt's read (n_batch tokens, a few seconds on a CPU), the reply's cache
(and the draft model's) is saved in memory and another request runs; when that one ends or its own
turn does, the caches go back, bytes as they were, so each reply is the one it would have written
alone and goes on from where it was.

A short request (fill-in-the-middle, or a few tokens from a short prompt) runs as soon as the
running reply has run MIN_RUN_S, and at least as long as the last short request took, so a stream of
them cannot starve it; it pauses only for another short one. Other replies take turns of
LONG_TURN_S, in order, at most MAX_TASKS of them part-way at once (the rest wait in the queue).

This module holds the rules: what counts as short, and when a running reply may pause.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from localspec.types import GenerationRequest

# A request is short where it asks for at most this many tokens (an editor's completion, a chat
# front end's title or tags) or fills in the middle, and its text is at most SHORT_PROMPT_CHARS:
# about as many tokens as a 2-core CPU reads in 10 to 30 s.
SHORT_MAX_TOKENS = 256
SHORT_PROMPT_CHARS = 16_000
# A reply runs this long after it starts (or resumes) before it may pause: a reply nearly done
# finishes rather than pay for the swap, and a pause's copies (milliseconds) stay a small share.
MIN_RUN_S = 1.0
# A reply's turn while other replies wait: long enough that the two copies of a switch (tens of
# milliseconds for a few thousand tokens' cache) stay a small share, short enough that a chat shows
# its words while an agent writes.
LONG_TURN_S = 3.0
# Replies part-way at once, each one's saved caches in memory (llama-server's four slots).
MAX_TASKS = 4

T = TypeVar("T")


def is_short(request: GenerationRequest) -> bool:
    """Whether `request` may run while a long reply pauses for it."""
    if request.suffix is None and request.max_tokens > SHORT_MAX_TOKENS:
        return False
    chars = len(request.prompt or "") + len(request.suffix or "")
    chars += sum(len(m.content) for m in request.messages) + sum(len(c.text) for c in request.extra)
    tokens = len(request.prompt_ids or ()) + len(request.context_ids)
    return chars + 4 * tokens <= SHORT_PROMPT_CHARS


@dataclass
class Turns:
    """When a running reply may hand the model over: to a short request after MIN_RUN_S of its own
    running and at least as long as the last short request took (a stream of them cannot starve
    it); to another reply after LONG_TURN_S (replies part-way resume in order, so each gets its
    share; a turn as long as the last pause would grow with every reply part-way)."""

    clock: Callable[[], float] = time.monotonic
    since: float = field(init=False)
    last_short: float = 0.0

    def __post_init__(self) -> None:
        self.since = self.clock()

    def due(self, long: bool = False) -> bool:
        minimum = LONG_TURN_S if long else max(MIN_RUN_S, self.last_short)
        return self.clock() - self.since >= minimum

    def resumed(self, last_short: float) -> None:
        """The reply runs again; the last short request took `last_short` seconds."""
        self.last_short = last_short
        self.since = self.clock()


def waiting(jobs: queue.Queue[T | None], wanted: Callable[[T], bool]) -> bool:
    """Whether a queued job `wanted` accepts waits (read as take_first reads it, nothing removed)."""
    with jobs.mutex:
        return any(job is not None and wanted(job) for job in jobs.queue)


def take_first(jobs: queue.Queue[T | None], wanted: Callable[[T], bool]) -> T | None:
    """Remove and return the first queued job `wanted` accepts, leaving the others in order; None
    where there is none.

    Reads the queue's deque under its own mutex (queue.Queue's `queue` and `mutex`, public since
    Python 2), and wakes a producer waiting for room, as `get` does.
    """
    with jobs.mutex:
        for job in jobs.queue:
            if job is not None and wanted(job):
                jobs.queue.remove(job)
                jobs.not_full.notify()
                return job
    return None
