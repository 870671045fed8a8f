"""A short request does not wait for a long reply to end: the long one pauses for it.

One model, one KV sequence, one request at a time: an editor's fill-in-the-middle completion sent
while an agent writes a 1,000-token edit waited for the whole edit (30 s and more on a CPU), so
the editor showed nothing, and its next keystroke cancelled it anyway. llama-server serves such
requests side by side in parallel slots. Here the engine's worker pauses the long reply between
two of its steps: the target's cache (and the draft model's) is saved in memory, the short request
runs whole, and the long reply's cache is loaded back, bytes as they were, so its reply is the one
it would have written alone and goes on from the next step.

A reply pauses while its prompt is read, too, between two of llama.cpp's chunks (n_batch
tokens, a few seconds on a CPU): an agent's 10,000-token prompt takes a minute and more to read
there, and a completion sent meanwhile waited for all of it.

This module holds the rules: what counts as short, and when a running reply may pause. The long
reply keeps at least half the model: it runs at least as long as its last pause lasted, and at
least MIN_RUN_S, before it pauses again, so a stream of completions cannot starve it.
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
    """When a running reply may pause: after MIN_RUN_S of its own running, and as long as its last pause."""

    clock: Callable[[], float] = time.monotonic
    since: float = field(init=False)
    last_pause: float = 0.0

    def __post_init__(self) -> None:
        self.since = self.clock()

    def due(self) -> bool:
        return self.clock() - self.since >= max(MIN_RUN_S, self.last_pause)

    def paused(self, seconds: float) -> None:
        self.last_pause = seconds
        self.since = self.clock()


@dataclass(frozen=True)
class Interrupt:
    """How a running reply hands the model over: `due` says a short request waits and the reply may
    pause for it now; `run` runs it, and leaves the reply's caches as they were."""

    due: Callable[[], bool]
    run: Callable[[], None]


def waiting(jobs: queue.Queue[T | None], wanted: Callable[[T], bool]) -> bool:
    """Whether a queued job `wanted` accepts waits (read as take_first reads it, nothing removed)."""
    with jobs.mutex:
        return any(job is not None and wanted(job) for job in jobs.queue)


def take_first(
    jobs: queue.Queue[T | None], wanted: Callable[[T], bool], room: Callable[[], bool] = lambda: True
) -> T | None:
    """Remove and return the first queued job `wanted` accepts, leaving the others in order; None
    where there is none, or where `room` (asked only once there is one) says no.

    Reads the queue's deque under its own mutex (queue.Queue's `queue` and `mutex`, public since
    Python 2), and wakes a producer waiting for room, as `get` does.
    """
    with jobs.mutex:
        for job in jobs.queue:
            if job is not None and wanted(job):
                if not room():
                    return None
                jobs.queue.remove(job)
                jobs.not_full.notify()
                return job
    return None
