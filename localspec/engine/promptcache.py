"""Prompts read before, kept in memory: a conversation that comes back after another one's request
goes on from its saved cache instead of reading its whole prompt again.

The target keeps one KV sequence, the last request's. An editor that asks for completions
between an agent's turns would otherwise make every agent turn read its whole context again
(tens of seconds for 10,000 tokens on a CPU). llama-server keeps idle slots' caches in memory
the same way (`--cache-ram`, 8 GiB by default). Before a request drops what the cache holds,
the engine saves it here (llama.cpp's sequence state: the KV cells' bytes and their positions);
a later prompt sharing more of its start with a saved one than with the live cache has it
loaded back, bytes as they were, so the reply is what it would have been had no other request
come between.

`PromptCache` is bookkeeping over token tuples and byte sizes; `switch` reads and writes the
model's states. The daemon may `drop` every saved cache from another thread, to make room for a
model it loads: saved caches go before any loaded model does.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localspec.engine.drafters.base import common_prefix
from localspec.errors import LocalspecError
from localspec.process.memory import room_for

if TYPE_CHECKING:
    from localspec.engine.drafters.model import ModelDrafter
    from localspec.engine.llama import LlamaModel

log = logging.getLogger("localspec.engine")

# Keeping a cache is worth its copy only where reading those tokens again would take a while:
# 256 positions are about a second's prompt reading on a 2-core CPU and 7 MB of a 1.5B's cache.
MIN_SAVED_TOKENS = 256
# A saved cache replaces the live one only where it holds this many more of the prompt's tokens:
# loading copies its whole state back (milliseconds) where a few tokens read cost as much.
MIN_GAIN_TOKENS = 64
GIB = 1 << 30


def default_limit(ram_total: int) -> int:
    """Bytes of saved caches a model may keep unless the user says: an eighth of the machine's
    memory, 4 GiB at most (llama-server keeps 8 GiB per server)."""
    return min(4 * GIB, ram_total // 8)


@dataclass(frozen=True)
class Saved:
    """One saved cache: the tokens its positions hold, in order, and llama.cpp's bytes of them."""

    tokens: tuple[int, ...]
    state: Any  # a ctypes byte array, as llama_state_seq_get_data wrote it
    size: int  # bytes
    # The draft model's cache of the same conversation, where it had read enough of it: loaded
    # with the target's, the draft drafts at once instead of reading the conversation again.
    draft: Saved | None = None

    @property
    def total(self) -> int:
        return self.size + (self.draft.size if self.draft is not None else 0)


class PromptCache:
    """Saved caches of one model, the least recently used dropped first past `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._saved: OrderedDict[tuple[int, ...], Saved] = OrderedDict()
        # `switch` (the engine's thread) and `drop` (the daemon's) each hold it throughout.
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return sum(s.total for s in self._saved.values())

    def __len__(self) -> int:
        return len(self._saved)

    def worth_saving(self, live: Sequence[int], kept: int, prompt: Sequence[int] = ()) -> bool:
        """Whether the live cache (its tokens `live`) is worth saving before `prompt` keeps only
        its first `kept` positions: enough would be lost, nothing saved already holds it, and it is
        not the same conversation cut further (the prompt's next tokens already further on in it:
        a long chat whose oldest messages went, server.truncation, whose earlier cut no request
        will ask for again)."""
        if self.limit <= 0 or len(live) - kept < MIN_SAVED_TOKENS:
            return False
        if _cut_further(live, prompt, kept):
            return False
        return not any(_starts_with(s.tokens, live) for s in self._saved.values())

    def add(self, saved: Saved) -> None:
        """Keep `saved`, and drop what it makes useless: saved caches it extends (their tokens
        are its first ones), then the least recently used until the cache fits its limit."""
        if saved.total > self.limit:
            return
        for key in [k for k in self._saved if _starts_with(saved.tokens, k)]:
            del self._saved[key]
        self._saved[saved.tokens] = saved
        while self.size > self.limit:
            self._saved.popitem(last=False)

    def best(self, prompt: Sequence[int], live_shared: int) -> tuple[Saved, int] | None:
        """The saved cache sharing the longest start with `prompt`, and how many tokens it shares,
        where that beats the live cache's `live_shared` by MIN_GAIN_TOKENS; None otherwise.
        The one returned counts as used (the last to be dropped)."""
        found: tuple[Saved, int] | None = None
        for saved in self._saved.values():
            shared = common_prefix(saved.tokens, prompt)
            if shared >= live_shared + MIN_GAIN_TOKENS and (found is None or shared > found[1]):
                found = (saved, shared)
        if found is not None:
            self._saved.move_to_end(found[0].tokens)
        return found

    def stats(self) -> tuple[int, int]:
        """How many caches are saved and their bytes (any thread)."""
        with self._lock:
            return len(self._saved), self.size

    def drop(self) -> int:
        """Forget every saved cache (their memory is freed with them); returns the bytes they held.
        Any thread: it waits for a `switch` under way."""
        with self._lock:
            freed = self.size
            self._saved.clear()
            return freed

    def switch(
        self,
        model: LlamaModel,
        live: Sequence[int],
        prompt: Sequence[int],
        use: bool,
        draft: ModelDrafter | None = None,
        save: bool = True,
    ) -> int:
        """Before `model` reads `prompt`: save its cache (holding `live`) and the draft model's
        if the prompt would drop much of it, then load the saved caches sharing most with the
        prompt if they share more than the live one. `use` False (the request asked for no
        cache): the prompt is read whole. `save` False: the live cache is saved elsewhere (a
        reply's that took a turn), not here.

        Returns how many of the prompt's first tokens the model's cache now holds."""
        with self._lock:
            return self._switch(model, live, prompt, use, draft, save)

    def keep(self, model: LlamaModel, live: Sequence[int], draft: ModelDrafter | None = None) -> None:
        """Save `model`'s cache (holding `live`), and the draft model's, where worth keeping, before
        something other than a prompt replaces it: a paused reply's cache loaded back over a short
        request's (engine.interleave), so the editor's next completion reads only what changed."""
        with self._lock:
            if self.worth_saving(live, 0):
                self._save(model, live, draft)

    def _switch(
        self,
        model: LlamaModel,
        live: Sequence[int],
        prompt: Sequence[int],
        use: bool,
        draft: ModelDrafter | None,
        save: bool,
    ) -> int:
        shared = common_prefix(live, prompt) if use else 0
        if save and self.worth_saving(live, shared, prompt):
            self._save(model, live, draft)
        found = self.best(prompt, shared) if use else None
        if found is None:
            return shared
        saved, shared = found
        try:
            model.load_state(saved.state, len(saved.tokens))
        except LocalspecError as exc:  # the model's cache is empty now: the prompt is read whole
            log.warning("%s", exc)
            del self._saved[saved.tokens]
            return 0
        if draft is not None and saved.draft is not None:
            draft.restore(saved.draft)
        return shared

    def _save(self, model: LlamaModel, live: Sequence[int], draft: ModelDrafter | None) -> None:
        draft = draft_holding(draft, live)
        size = state_bytes(model, draft)
        if size > self.limit or not room_for(size):  # checked before anything is copied
            return
        state = model.save_state()
        if state is None:
            return
        drafts = draft.save() if draft is not None else None
        self.add(Saved(tuple(live), state, len(state), drafts))


def draft_holding(draft: ModelDrafter | None, live: Sequence[int]) -> ModelDrafter | None:
    """`draft` where its cache holds enough of the conversation `live` to be worth saving with the
    target's; None where it has not read enough of it (it reads what it lacks when it next drafts)."""
    if draft is None or common_prefix(draft.seen, live) < MIN_SAVED_TOKENS:
        return None
    return draft


def state_bytes(model: LlamaModel, draft: ModelDrafter | None) -> int:
    """What saving `model`'s cache, and `draft`'s, would copy."""
    return model.state_size() + (draft.model.state_size() if draft is not None else 0)


# How many of a prompt's tokens after what it shares with the live cache must appear further on in
# that cache for the two to be one conversation cut further (a message's worth).
CUT_WINDOW = 64


def _cut_further(live: Sequence[int], prompt: Sequence[int], shared: int) -> bool:
    """Whether the CUT_WINDOW tokens of `prompt` after its first `shared` appear later in `live`
    (searched as bytes: a 16,000-token cache in well under a millisecond)."""
    window = prompt[shared : shared + CUT_WINDOW]
    if len(window) < CUT_WINDOW:
        return False
    item = array("i").itemsize
    haystack = array("i", live[shared + 1 :]).tobytes()
    needle = array("i", window).tobytes()
    at = haystack.find(needle)
    while at >= 0 and at % item:  # matched across two tokens' bytes: look on
        at = haystack.find(needle, at + 1)
    return at >= 0


def _starts_with(tokens: Sequence[int], start: Sequence[int]) -> bool:
    return len(start) <= len(tokens) and common_prefix(tokens, start) == len(start)
