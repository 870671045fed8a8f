"""Prompt lookup: draft the continuation of the latest earlier occurrence of the context's last n-gram.

Code edits (renaming a variable, adding docstrings) copy long runs of the prompt,
so the text that followed the same few tokens last time is often the text that
comes next. The index is updated incrementally: each step costs a few dict
operations, not a scan of the context. `NgramMemory` extends the lookup across
requests: agent loops and editors send the same code again in new prompts, and
models re-emit what an earlier reply wrote. A reply that copies the prompt in
another form (inside a JSON string, or without the line numbers an agent's file
view shows) is looked up in that form too: the drafter takes the prompt's other
forms (`views`, see views.py) and looks each up beside the context.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from localspec.engine.drafters.base import Draft
from localspec.engine.drafters.cursor import CopyCursor, TokenText
from localspec.engine.drafters.views import PromptView
from localspec.engine.sampling import Draws
from localspec.types import SamplingParams


@dataclass(frozen=True)
class NgramMatch:
    """A proposed continuation and the length of the n-gram that matched (its evidence)."""

    tokens: list[int]
    match_len: int
    # A lookup's: where `tokens` begin in the text it was looked up in (-1: nothing matched); the
    # copy cursor anchors there. A cursor draft's: the cursor's place in the copied text, which
    # the draft begins at unless it first finishes an edit's new tokens (nothing anchors on it).
    start: int = -1
    # A short match away from the copy the reply is making, while it writes an edit there: the
    # likeness is mostly the edit's new name, spelled out in the instruction, and the reply goes
    # back to its copy after it (see `_follow`).
    astray: bool = False


class NgramIndex:
    """Maps every n-gram (n in [min_n, max_n]) of a token list to the position after its latest occurrence."""

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= min_n <= max_n")
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}
        self._indexed = 0

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)

    def truncate(self, length: int) -> None:
        """Forget tokens past `length` (and the n-grams that reach into them)."""
        if length >= len(self.tokens):
            return
        del self.tokens[length:]
        self._next = {k: v for k, v in self._next.items() if v < length}
        self._indexed = min(self._indexed, length)

    def _index_upto(self, end: int) -> None:
        # An n-gram ending at position j-1 is recorded as "followed by position j".
        toks = self.tokens
        first = max(self._indexed, 1)
        if end - first >= BULK_INDEX:
            self._index_bulk(first, end)
        else:
            for j in range(first, end + 1):
                for n in range(self.min_n, self.max_n + 1):
                    if j - n >= 0:
                        self._next[tuple(toks[j - n : j])] = j
        self._indexed = max(self._indexed, end)

    def _index_bulk(self, first: int, end: int) -> None:
        """Positions first..end at once, each n-gram size in one dict update: the tuples are built
        by zip in C, not sliced one by one (the bench set's 935-token prompt, Qwen2.5's tokens:
        1.21 ms to 0.74 ms; 1,000 tokens all distinct: 2.1-3.0 to 0.8 ms), paid at the first
        step of every request auto runs. Within a size positions go in order, so the latest
        occurrence wins, as one at a time."""
        toks = self.tokens
        for n in range(self.min_n, self.max_n + 1):
            lo = max(first, n)  # j - n >= 0
            if lo > end:
                continue
            columns = [toks[lo - n + i : end - n + i + 1] for i in range(n)]
            self._next.update(zip(zip(*columns, strict=True), range(lo, end + 1), strict=True))

    def index_all(self) -> None:
        """Index every n-gram, the last one's included (for lookups from outside this token list)."""
        self._index_upto(len(self.tokens))

    def propose(self, k: int) -> NgramMatch:
        """Up to k tokens that followed the longest matching suffix's latest earlier occurrence."""
        # Index everything but the current suffix's own occurrence, so the match is an earlier one.
        self._index_upto(len(self.tokens) - 1)
        return self.lookup(self.tokens, k, longest=len(self.tokens) - 1)

    def lookup(self, context: Sequence[int], k: int, longest: int | None = None) -> NgramMatch:
        """Up to k indexed tokens that followed the longest suffix of `context` (at most `longest`
        tokens) seen here; the continuation stops at a SEPARATOR."""
        toks = self.tokens
        size = len(toks)
        top = min(self.max_n, len(context) if longest is None else longest)
        for n in range(top, self.min_n - 1, -1):
            start = self._next.get(tuple(context[len(context) - n :]))
            if start is not None and start < size:
                run = toks[start : min(start + k, size)]
                if SEPARATOR in run:
                    run = run[: run.index(SEPARATOR)]
                if n == self.max_n:
                    n = self._matched_back(context, start, n, longest)
                return NgramMatch(run, n, start)
        return NgramMatch([], 0)

    def _matched_back(self, context: Sequence[int], start: int, n: int, longest: int | None) -> int:
        """How far the match really reaches back, past the longest n-gram indexed (up to LONG_MATCH).

        A match of max_n tokens may be the tail of a copy dozens of tokens long: the longer the
        copy so far, the surer its next tokens (docs/benchmarks.md: 0.76-0.93 of first tokens right
        after 5-11 matched tokens, 0.96-1.00 after 24 or more). A few comparisons per lookup.
        """
        toks, reach = self.tokens, min(LONG_MATCH, len(context) if longest is None else longest)
        while n < reach and start - n - 1 >= 0 and toks[start - n - 1] == context[len(context) - n - 1]:
            n += 1
        return n


# Positions indexed at once, past which `_index_upto` builds each n-gram size's keys in one go.
BULK_INDEX = 16
# Between two remembered token sequences: no n-gram spans it, no continuation crosses it.
SEPARATOR = -1
# How far back a match of max_n tokens is followed to measure its real length (its evidence).
LONG_MATCH = 32


class NgramMemory:
    """The prompts and outputs of earlier requests to one model, for n-gram lookup across requests.

    Bounded and in memory only (never written anywhere): the newest `capacity` tokens are kept;
    past twice that, the oldest sequences are dropped and the index is rebuilt, so the rebuild's
    cost is spread over many requests. Matches need `min_n` tokens: across requests a short
    n-gram says little about what comes next.
    """

    def __init__(self, capacity: int = 16384, min_n: int = 4, max_n: int = 8) -> None:
        self.capacity = capacity
        self.min_n, self.max_n = min_n, max_n
        self._sequences: deque[list[int]] = deque()
        self._index = NgramIndex(min_n, max_n)

    @property
    def size(self) -> int:
        return len(self._index.tokens)

    def remember(self, tokens: Sequence[int]) -> None:
        """Keep one finished request's tokens (prompt and output) for later requests."""
        if self.capacity <= 0 or len(tokens) <= self.min_n:
            return
        sequence = list(tokens[-self.capacity :])
        self._sequences.append(sequence)
        self._index.extend([*sequence, SEPARATOR])
        if self.size > 2 * self.capacity:
            self._rebuild()

    def _rebuild(self) -> None:
        keep: deque[list[int]] = deque()
        total = 0
        for sequence in reversed(self._sequences):  # newest first; older ones are forgotten
            if total + len(sequence) > self.capacity:
                break
            keep.appendleft(sequence)
            total += len(sequence)
        self._sequences = keep
        self._index = NgramIndex(self.min_n, self.max_n)
        for sequence in keep:
            self._index.extend([*sequence, SEPARATOR])

    def index(self) -> None:
        """Index what was remembered since the last lookup. Done after a request ends (and while the
        next prompt is read): left to the next reply's first lookup here, at its second token, it
        held that token up 3-18 ms with the fence scan (the 1.5B on the bench set, 2 cores); after
        a reply it takes 0.6 ms (median; 1.7 at most)."""
        self._index.index_all()

    def lookup(self, context: Sequence[int], k: int) -> NgramMatch:
        """What followed the longest suffix of `context` in earlier requests."""
        self.index()
        return self._index.lookup(context, k)


# A fixed n-gram method drafts only on a convincing match: the context's last 5+ tokens seen before.
# Shorter matches are mostly wrong off copied text, and each costs a batched verify (2.25 tokens for
# 4 on the 2-core CPU). Replayed over the 8 bench traces: min 2 ran at 0.79-0.97x of plain decoding
# where nothing is copied; min 5 never below 1.00x, and 1.42x on the rename (2: 1.46x).
NGRAM_MIN_MATCH = 5


NGRAM_MAX_MATCH = 8
# auto looks up matches from 2 tokens: it weighs each proposal by its match length, and a short
# match inside a copy is often right (replayed on the bench set's edits: 0.73 of 2-token matches'
# first tokens right, 0.88 of 3-token ones).
AUTO_MIN_MATCH = 2
# Tokens a reply must have written before earlier requests' text is looked up (see `peek`).
MEMORY_AFTER = 2


class NgramDrafter:
    """Prompt lookup: copy what followed the longest recent match of the context's tail."""

    name = "ngram"

    def __init__(
        self,
        min_n: int = NGRAM_MIN_MATCH,
        max_n: int = NGRAM_MAX_MATCH,
        memory: NgramMemory | None = None,
        text: TokenText | None = None,
        markdown: bool = True,
        ends: Collection[int] = (),
        views: Sequence[PromptView] = (),
        skipped: Collection[int] = (),
    ) -> None:
        """`ends`: the model's end-of-generation tokens (a draft stops at the first one).
        `views`: the prompt's text in the other forms a reply may copy it in (views.py), tokenized.
        `skipped`: positions in the prompt a copy never carries over (the numbers of numbered
        lines, `skipped_tokens`): a draft from the context ends before them."""
        self._min_n, self._max_n = min_n, max_n
        self._markdown = markdown
        self._ends = frozenset(ends)
        self._index = NgramIndex(min_n, max_n)
        # The token list peek() saw last (see there).
        self._peeked: Sequence[int] | None = None
        self._memory = memory
        self._prompt_len = 0
        self._cursor = CopyCursor(text)
        self._views = [_View(view, min_n, max_n, text) for view in views if view.tokens]
        self._skipped = frozenset(skipped)
        self._text = text
        self._escaping = text is None  # whether the reply has escaped a character (see _view_copy)

    @classmethod
    def for_auto(
        cls,
        memory: NgramMemory | None = None,
        text: TokenText | None = None,
        markdown: bool = True,
        ends: Collection[int] = (),
        views: Sequence[PromptView] = (),
        skipped: Collection[int] = (),
    ) -> NgramDrafter:
        """The lookup auto plans with (the engine's, and every replay's that predicts it).

        `markdown`: replies are Markdown, code in them fenced (a chat reply's; a raw completion's
        or a fill-in-the-middle's text is not).
        """
        return cls(AUTO_MIN_MATCH, NGRAM_MAX_MATCH, memory, text, markdown, ends, views, skipped)

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        """A request with this prompt. Where the drafter has already followed it (auto peeks from
        its first step, the engine starts a drafter at its first draft), what it has learned of
        the reply is kept: the copy's place and the edits made so far."""
        if self._prompt_len in (0, len(prompt)) and self._index.tokens[: len(prompt)] == list(prompt):
            self._prompt_len = len(prompt)
            self._cursor.begin_reply(len(prompt))
            return
        self._index = NgramIndex(self._min_n, self._max_n)
        self._index.extend(prompt)
        self._peeked = None
        self._prompt_len = len(prompt)
        self._cursor.start(len(prompt))
        for view in self._views:  # the reply after each begins again
            view.restart()
        self._escaping = self._text is None

    def prepare(self, prompt: Sequence[int]) -> None:
        """Do now what the first lookups would do on the prompt alone: index it and its other forms,
        scan it for fences, index earlier requests' text. The engine calls this while the target
        reads the prompt (on a GPU, at the same time): done at the reply's first steps, it held up
        the reply after its first token (the bench set's 935-token prompt: 0.7 ms for its index;
        an agent's 16,000-token file view: 58 ms)."""
        self.start(prompt)
        self._index.index_all()
        for view in self._views:
            if self._escaping or not view.escaped:  # as lookups: an escaped form once the reply escapes
                view.index.index_all()
        self._cursor.scan(prompt)
        if self._memory is not None:
            self._memory.index()

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        match = self.peek(tokens, k)
        return Draft(match.tokens, evidence=match.match_len)

    def peek(self, tokens: Sequence[int], k: int) -> NgramMatch:
        """What `propose` would draft now (the same tokens, as a prefix for a smaller k), at no cost.

        The auto policy looks before it chooses: a long match is worth a verify, a short one seldom.
        """
        known = len(self._index.tokens)
        if tokens is self._peeked and len(tokens) >= known:
            # The list peeked at last, since grown: a request's tokens are only ever appended to
            # (committed ones), so comparing its whole prefix again, every step, is not needed.
            self._index.extend(tokens[known:])
        elif tokens[:known] != self._index.tokens:
            self.start(tokens)
        else:
            self._index.extend(tokens[known:])
        self._peeked = tokens
        own = self._follow(self._index, self._cursor, self._index.propose(k), k)
        own = self._view_copy(tokens, k, self._before_skipped(own))
        # Every chat prompt ends in the same template tokens, which an earlier request's prompt
        # ended in too: earlier requests count only once this reply has two tokens of its own.
        replied = len(tokens) - self._prompt_len
        if self._memory is None or own.match_len >= self._memory.max_n or replied < MEMORY_AFTER:
            return self._until_end(own)
        # The context's own match first; an earlier request's only where it matched longer.
        earlier = self._memory.lookup(tokens, k)
        if earlier.match_len > own.match_len and earlier.match_len >= self._min_n and earlier.tokens:
            return self._until_end(earlier)
        return self._until_end(own)

    @property
    def copies_ended(self) -> int:
        """Copies this reply left and never came back to (CopyCursor.ended): it is made of pieces."""
        return self._cursor.ended

    def _view_copy(self, tokens: Sequence[int], k: int, own: NgramMatch) -> NgramMatch:
        """The draft from the prompt's other form whose match reaches furthest back, where it reaches
        further than the context's own (equal: the context's own).

        Where the reply copies the prompt in another form, the context's own lookup matches one line
        at a time: inside a JSON string the reply writes `\\n` where the prompt has a line break (a
        file rewritten into a JSON answer: 16 drafting steps in 256 tokens), and a file an agent was
        shown numbered is written back without its numbers; the view matches across the lines.
        Each view is looked up with the reply after it, as the context is, and indexed at its first
        lookup (58 ms for 16,000 tokens on 2 cores, as the context's own). Escaped views, where the
        tokens' text is known, not before the reply has written a backslash: they differ from the
        prompt only at its escapes, and a reply with tools offered is mostly prose or a call with no
        escapes in it.
        """
        if not self._views:
            return own
        written = len(self._views[0].index.tokens) - self._views[0].base
        new = tokens[self._prompt_len + written :]
        if not self._escaping:
            text = self._text
            assert text is not None
            self._escaping = any("\\" in text(token) for token in new)
        best = own
        for view in self._views:
            view.index.extend(new)
            if view.escaped and not self._escaping:
                continue
            found = self._follow(view.index, view.cursor, view.index.propose(k), k)
            if found.match_len > best.match_len and found.tokens:
                best = found
        return best

    def _before_skipped(self, match: NgramMatch) -> NgramMatch:
        """The context's match up to the first prompt token a copy never carries over; no match where
        that is its first: a file shown numbered and written back runs, at every line's end, into the
        next line's number (a 15-token draft lost where the unnumbered view's shorter match was
        right), and a match inside the number is a chance one."""
        if not self._skipped or match.start < 0:
            return match
        for i in range(len(match.tokens)):
            if match.start + i in self._skipped:
                return replace(match, tokens=match.tokens[:i]) if i else NgramMatch([], 0)
        return match

    def _until_end(self, match: NgramMatch) -> NgramMatch:
        """The match up to its first end-of-generation token, that one kept: if it is right the
        reply ends there, and what follows it is never used. A reply that restates the question
        copies the user's turn, whose end runs on into the template's tokens and the reply's own
        opening (a 31-token draft where 12 could be used, 1 was right)."""
        for i, token in enumerate(match.tokens):
            if token in self._ends:
                return replace(match, tokens=match.tokens[: i + 1])
        return match

    def in_prose(self, tokens: Sequence[int]) -> bool:
        """Whether the reply's end (`tokens`, as last peeked) is known to lie in prose: a Markdown
        reply outside its fenced code. False where that cannot be told (no text; not Markdown)."""
        return self._markdown and self._cursor.reply_in_code(tokens) is False

    def _follow(self, index: NgramIndex, cursor: CopyCursor, own: NgramMatch, k: int) -> NgramMatch:
        """The copy cursor's draft (learned edits applied) where it has followed the reply at least
        as long as the lookup matched; otherwise the lookup's match, where the cursor moves."""
        tokens = index.tokens
        cursor.feed(tokens)
        # The cursor trusts the matches a fixed method drafts on (5+ tokens), whatever this lookup
        # proposes: auto weighs 2-token matches, but a cursor anchored on one follows a chance
        # likeness (replayed with 2: bisect's rename 1.04x of none; with 5: 1.35x).
        # Where the cursor's own place matches the reply as long as the lookup's match does, that
        # is the place to copy from: the cursor knows the edits, and which of several equal matches
        # (four functions' signatures) the reply is copying. The lookup takes the latest.
        level = (
            cursor.following
            and bool(own.tokens)
            and (own.match_len <= cursor.run or cursor.matches(tokens, own.match_len))
        )
        if level and cursor.pos is not None and own.match_len > cursor.run:
            cursor.anchor(cursor.pos, own.match_len)
        elif own.tokens and own.match_len >= NGRAM_MIN_MATCH and not level:
            cursor.anchor(own.start, own.match_len)
        if cursor.following and (cursor.run >= NGRAM_MIN_MATCH or level):
            follow = cursor.draft(tokens, k)
            if follow or cursor.held:  # held at its first token: no draft (the lookup would copy the old one)
                return NgramMatch(follow, min(cursor.run, LONG_MATCH), cursor.pos or 0)
        if own.tokens and own.match_len < NGRAM_MIN_MATCH and cursor.strays(own.start):
            return replace(own, astray=True)
        return own


class _View:
    """One of the prompt's other forms with the reply after it: looked up, and followed by its own
    copy cursor (a copy's edits are learned in that form as in the context's)."""

    def __init__(self, view: PromptView, min_n: int, max_n: int, text: TokenText | None) -> None:
        self.escaped = view.escaped
        self.base = len(view.tokens)
        self.index = NgramIndex(min_n, max_n)
        self.index.extend(view.tokens)
        self.cursor = CopyCursor(text)
        self.cursor.start(self.base)

    def restart(self) -> None:
        """A new reply after the same prompt."""
        self.index.truncate(self.base)
        self.cursor.start(self.base)
