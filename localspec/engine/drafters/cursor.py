"""Follow the copy a reply is making, through its edits: where an n-gram lookup loses the thread.

A reply that renames `lo` to `low` in a file it copies differs from the file every few tokens,
and prompt lookup needs several tokens in a row seen before to match again: on a rename it
drafts between the renamed names, seldom through them. The cursor keeps the place in the
earlier text the reply is copying from. When the reply leaves it, the cursor finds where it
comes back (a few tokens later, a few tokens on), and learns the edit in between: the old
tokens and what the reply wrote instead. An edit the reply makes a second time is confirmed,
and drafts apply it from then on: the third `lo` is drafted as `low`, and every one after.
Until then drafts copy the old tokens, as the lookup would: in prose most "edits" are a
sentence going its own way, and a draft through one is a verify thrown away. Where the reply
copies an edit's old tokens unchanged (a one-off bug fix, or a rename the model once leaves
undone) the cursor follows the copy on, and drafts stop applying that edit until the reply
makes it again. A confirmed edit the reply has once left undone is in doubt: until it is made
again, drafts end where it would apply, and the target says which way it goes there (a draft
through it, either way, risked the whole verify past it). Given the tokens' text, a name a
confirmed edit renames is in doubt in its other token forms too (` lo` renamed, `(lo` and `'lo`
are other tokens): drafts end there until the reply has written that form once, renamed or not.
In fenced code (between ``` lines) a one-token rename of a name is in doubt from its first time
until the reply makes it again: a renamed name in code is mostly renamed everywhere, and a draft
copying the old name would lose the verify past it; in prose a word swapped once (` Dinner` for
` Lunch`) mostly is not swapped again, and drafts copy the old word on, as the lookup would.
Where the reply then copies the old name twice without renaming it again, the rename was a one-off
(a fix at one place), and drafts copy the old name on. (Putting the name's other token forms in
doubt too, or letting the doubt go at the first copy of the old name, was slower in replay: the 1.5B
renames some names inconsistently.) The same fence scan tells auto whether a chat reply is in prose
at its end (`reply_in_code`), where it bets on short matches only what the request can lose.

Pure logic over token lists: the n-gram drafter feeds it and asks it for drafts.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher
from typing import NamedTuple

# The longest edit learned, in tokens on either side: renames, operators, a word or two.
MAX_EDIT = 4
# How far on in the copied text the reply may come back, and how long the stretch between
# leaving and coming back may be for the edits in it to be learned (two renames close together).
SKIP = 2 * MAX_EDIT
# Tokens the reply must copy again after it left the copy before the cursor takes it as back
# (and learns the edit): fewer mistake a common token (",", a newline) for the copy going on.
RESYNC = 3
# A reply away from its copy this long has left it: the n-gram lookup finds the next one.
GIVE_UP = 64
# At most this many edits kept per request (the oldest forgotten first).
MAX_EDITS = 256
# A rename in code made once that the reply then copies the old name of this many times, without
# making it again, was a one-off (a fix at one place): drafts copy the old name on from then on.
# Once is not enough: the 1.5B leaves a name it renames everywhere else as it was now and then.
ONE_OFF_COPIES = 2

Key = tuple[int, ...]
# A token's text (its bytes decoded), to tell forms of one name apart: ` lo`, `(lo`, `'lo`.
TokenText = Callable[[int], str]
# What leads a name in a token: spaces and punctuation.
_LEAD = re.compile(r"^[^\w]+")
# What opens and closes a fenced code block in Markdown (what chat replies and prompts put code in):
# a line that begins, after spaces or tabs, with three backticks.
FENCE_TICKS = 3
# Where the fence scan is between tokens: at a line's start (nothing but spaces or tabs yet), and
# the backticks opening the line so far (a tokenizer may split ``` into several tokens).
_LineState = tuple[bool, int]
_LINE_START: _LineState = (True, 0)


class _Expected(NamedTuple):
    """The token the copy expects next, the cursor's state once the reply wrote it, and the
    edits that writing it confirms."""

    token: int | None
    pos: int
    pending: Key
    edit_at: int
    edit_out: int
    used: list[Key]


class CopyCursor:
    """Where in `tokens` (the prompt and the reply so far) the reply copies from, and its edits."""

    def __init__(self, text: TokenText | None = None) -> None:
        self._text = text
        self._names: dict[int, str | None] = {}  # a token's name part, by token (a cache)
        # The fence scan's step over a token: the state after it and the fences it opens or closes,
        # by token and state before it (a cache).
        self._lines: dict[tuple[int, _LineState], tuple[_LineState, int]] = {}
        self.reset()

    def start(self, fed: int) -> None:
        """A new request: nothing learned, the first `fed` tokens (its prompt) taken as fed."""
        self.reset()
        self._seen = self._reply_from = fed

    def begin_reply(self, at: int) -> None:
        """The reply begins at tokens[at] (what was fed before it is the prompt)."""
        self._reply_from = at

    def reset(self) -> None:
        self.edits: dict[Key, Key] = {}
        self.confirmed: set[Key] = set()  # edits the reply has made twice
        self.doubtful: set[Key] = set()  # confirmed edits the reply has since left undone
        # The last draft ended at an edit in doubt (a code rename made once included) or a renamed
        # name's unseen form.
        self.held = False
        self.seen_forms: set[int] = set()  # tokens the reply has written while following the copy
        self.code_renames: set[Key] = set()  # one-token renames of a name learned in fenced code
        self._copied: Counter[Key] = Counter()  # how often the reply copied a code rename's old name
        self._fences: list[int] = []  # the tokens that end a fence line's ```, as far as scanned
        self._fenced_to = 0  # tokens scanned for fences
        self._line_state = _LINE_START  # the fence scan's state after them
        self._lengths: list[int] = []  # the edits' old-side lengths, longest first
        self.pos: int | None = None  # the next token to copy, as an index into tokens
        self._pending: Key = ()  # the rest of an edit's new tokens being written
        self._edit_at = 0  # where the edit being written starts (its old tokens) ...
        self._edit_out = 0  # ... and where its new tokens start in the reply
        self._left: tuple[int, int] | None = None  # (source, reply) indices where the reply left the copy
        self.run = 0  # tokens the cursor has followed since it last lost the reply
        # Copies the reply left and never came back to: the cursor, away from one, was anchored
        # elsewhere. A reply that does this is stitched from pieces, not one copy with edits in it.
        self.ended = 0
        self._seen = 0  # tokens of `tokens` already fed
        self._reply_from = 0  # where the reply begins in tokens (after the prompt)

    @property
    def following(self) -> bool:
        return self.pos is not None and self._left is None

    def strays(self, pos: int) -> bool:
        """Whether copying from tokens[pos] on would leave the copy the reply is making: it is away
        from it (writing an edit), and pos is not where it would come back (within SKIP tokens on
        from where it left, RESYNC more to match on)."""
        if self._left is None:
            return False
        return not self._left[0] <= pos <= self._left[0] + SKIP + RESYNC

    def anchor(self, pos: int, run: int) -> None:
        """Copy from `pos` on (an n-gram match found it, `run` tokens long)."""
        if self._left is not None:
            self.ended += 1
        self.pos, self._pending, self._left, self.run = pos, (), None, run

    def feed(self, tokens: Sequence[int]) -> None:
        """Follow every token of `tokens` not fed before (it extends what was fed)."""
        for q in range(self._seen, len(tokens)):
            self._step(tokens, q)
        self._seen = len(tokens)

    def matches(self, tokens: Sequence[int], n: int) -> bool:
        """Whether the n tokens before the cursor's place are the last n of `tokens`, as those of an
        n-token lookup match are (not while an edit's new tokens are being written)."""
        if not self.following or self._pending or self.pos is None or n > self.pos:
            return False
        return list(tokens[self.pos - n : self.pos]) == list(tokens[len(tokens) - n :])

    def draft(self, tokens: Sequence[int], k: int) -> list[int]:
        """The next k tokens of the copy, with the confirmed edits applied; nothing when lost."""
        self.held = False
        if not self.following or k <= 0:
            return []
        assert self.pos is not None
        out = list(self._pending[:k])
        pos = self.pos
        renamed = self._renamed_names()
        while len(out) < k:
            edit = self._edit_at_pos(tokens, pos)
            if edit is not None and edit[0] in self.confirmed:
                old, new = edit
                out.extend(new[: k - len(out)])
                pos += len(old)
                continue
            if edit is not None and (edit[0] in self.doubtful or edit[0] in self.code_renames):
                # Made some places and not others, or a rename in code made once: the target decides.
                self.held = True
                break
            if pos >= len(tokens):
                break
            if renamed and self._other_form(tokens[pos], renamed):
                self.held = True  # a renamed name in a form the reply has not written yet
                break
            out.append(tokens[pos])
            pos += 1
        return out

    def _renamed_names(self) -> set[str]:
        """The names confirmed (or doubtful) one-token edits rename, where the tokens' text is known."""
        if self._text is None:
            return set()
        names = (self._name(old[0]) for old in self.confirmed | self.doubtful if len(old) == 1)
        return {name for name in names if name is not None}

    def _other_form(self, token: int, renamed: set[str]) -> bool:
        return token not in self.seen_forms and self._name(token) in renamed and (token,) not in self.edits

    def _name(self, token: int) -> str | None:
        """A token's name part (its text past leading spaces and punctuation), None if it has none."""
        if token in self._names:
            return self._names[token]
        assert self._text is not None
        rest = _LEAD.sub("", self._text(token))
        name = rest if rest.isidentifier() else None
        self._names[token] = name
        return name

    def _rename(self, old: Key, new: Key) -> bool:
        """Whether an edit turns one name into another, one token each (` lo` into ` low`)."""
        if len(old) != 1 or len(new) != 1:
            return False
        before, after = self._name(old[0]), self._name(new[0])
        return before is not None and after is not None and before != after

    def reply_in_code(self, tokens: Sequence[int]) -> bool | None:
        """Whether the reply's end lies inside a fenced code block the reply opened (None: the
        tokens' text is not known). The prompt's own fences do not count: a pasted file may leave
        one open."""
        if self._text is None:
            return None
        # An odd number of fences between the reply's start and its end.
        return self._in_code(tokens, len(tokens)) != self._in_code(tokens, self._reply_from)

    def scan(self, tokens: Sequence[int]) -> None:
        """Scan `tokens` (a prompt) for fences now, so that `reply_in_code` reads only the reply's."""
        if self._text is not None:
            self._in_code(tokens, len(tokens))

    def _in_code(self, tokens: Sequence[int], pos: int) -> bool:
        """Whether tokens[pos] lies inside a fenced code block (after an odd number of fence lines;
        a ``` inside a line, as in "answer in one ```python block", is no fence)."""
        state = self._line_state
        for i in range(self._fenced_to, pos):
            state, fences = self._scan(tokens[i], state)
            self._fences.extend([i] * fences)
        if pos > self._fenced_to:
            self._line_state, self._fenced_to = state, pos
        return bisect_left(self._fences, pos) % 2 == 1

    def _scan(self, token: int, state: _LineState) -> tuple[_LineState, int]:
        """The fence scan over one token's text: the state after it, and the fence lines it ends
        (the third backtick of a line's opening ``` in it)."""
        step = self._lines.get((token, state))
        if step is None:
            assert self._text is not None
            start, ticks = state
            fences = 0
            for char in self._text(token):
                if char == "\n":
                    start, ticks = True, 0
                elif start and char == "`":
                    ticks += 1
                    if ticks == FENCE_TICKS:  # the rest of the line (```python) says nothing more
                        fences, start, ticks = fences + 1, False, 0
                elif not (start and ticks == 0 and char in " \t"):
                    start, ticks = False, 0
            step = self._lines[(token, state)] = ((start, ticks), fences)
        return step

    # --- following ----------------------------------------------------------------------------

    def _step(self, tokens: Sequence[int], q: int) -> None:
        if self.pos is None:
            return
        if self._left is not None:
            self._resync(tokens, q)
            return
        expected = self._next(tokens, q)
        if expected.token is not None and tokens[q] == expected.token:
            self.pos, self._pending = expected.pos, expected.pending
            self._edit_at, self._edit_out = expected.edit_at, expected.edit_out
            self.confirmed.update(expected.used)
            self.doubtful.difference_update(expected.used)
            for used in expected.used:
                self._copied.pop(used, None)
            self.seen_forms.add(tokens[q])
            self.run += 1
            return
        if expected.used and self.pos < q and tokens[q] == tokens[self.pos]:
            # The reply copied the old tokens where a learned edit would change them: still the
            # copy. The edit is not (or no longer) made everywhere, so drafts stop applying it
            # until the reply makes it again (a rename a model once leaves undone stays learned).
            self.doubtful.update(used for used in expected.used if used in self.confirmed)
            self.confirmed.difference_update(expected.used)
            self._copied.update(used for used in expected.used if used in self.code_renames)
            self.code_renames.difference_update(
                used for used in expected.used if self._copied[used] >= ONE_OFF_COPIES
            )
            self.pos += 1
            self.run += 1
            return
        # Left the copy: measured from before the edit being written, if one was.
        self._left = (self._edit_at, self._edit_out) if self._pending else (self.pos, q)
        self._pending = ()
        self._resync(tokens, q)

    def _next(self, tokens: Sequence[int], q: int) -> _Expected:
        """What the copy expects at reply index q."""
        assert self.pos is not None
        if self._pending:
            return _Expected(self._pending[0], self.pos, self._pending[1:], self._edit_at, self._edit_out, [])
        pos, used = self.pos, []
        while True:
            edit = self._edit_at_pos(tokens, pos, limit=q)
            if edit is None:
                break
            old, new = edit
            used.append(old)
            if new:
                return _Expected(new[0], pos + len(old), new[1:], pos, q, used)
            pos += len(old)  # a learned deletion: the copy skips the old tokens
        if pos >= q:  # caught up with the reply itself: nothing written yet to copy
            return _Expected(None, pos, (), pos, q, used)
        return _Expected(tokens[pos], pos + 1, (), pos, q, used)

    def _resync(self, tokens: Sequence[int], q: int) -> None:
        """Is the reply, at index q, back on the copy a few tokens on? Then learn the edit."""
        assert self._left is not None
        src, out = self._left
        i = q + 1 - out - RESYNC  # the reply's tokens before the copy resumes
        if i >= 0:
            tail = list(tokens[out + i : q + 1])
            for j in range(SKIP + 1):
                if src + j + RESYNC > out + i:  # the copy must come from earlier text
                    break
                if list(tokens[src + j : src + j + RESYNC]) == tail:
                    if i == j == 0:  # the reply copied the old tokens after all: that edit was one-off
                        self._forget(tokens, src)
                    code = self._text is not None and self._in_code(tokens, src)
                    self._learn(tuple(tokens[src : src + j]), tuple(tokens[out : out + i]), code)
                    self.pos, self._left, self.run = src + j + RESYNC, None, RESYNC
                    return
        if i > GIVE_UP:
            self.pos, self._left = None, None

    def _learn(self, old: Key, new: Key, code: bool = False) -> None:
        """Learn the edits that turn `old` (the copied text skipped) into `new` (what the reply wrote);
        `code`: the copied text is in a fenced code block."""
        if not old or len(new) > SKIP:
            return  # an insertion applies nowhere else; a long change is not an edit to repeat
        if old == new:
            self._drop(old)  # the reply copied what an edit changed: it was one-off
        for op, a0, a1, b0, b1 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if op in ("replace", "delete") and a1 - a0 <= MAX_EDIT and b1 - b0 <= MAX_EDIT:
                piece, change = old[a0:a1], new[b0:b1]
                if self.edits.pop(piece, None) != change:  # re-inserted: the newest kept longest
                    self._unjudged(piece)  # a different edit of the same tokens starts unconfirmed
                    if code and self._rename(piece, change):
                        self.code_renames.add(piece)
                self.edits[piece] = change
        while len(self.edits) > MAX_EDITS:
            self._drop(next(iter(self.edits)))
        self._lengths = sorted({len(o) for o in self.edits}, reverse=True)

    def _forget(self, tokens: Sequence[int], pos: int) -> None:
        edit = self._edit_at_pos(tokens, pos)
        if edit is not None:
            self._drop(edit[0])

    def _drop(self, old: Key) -> None:
        self.edits.pop(old, None)
        self._unjudged(old)
        self._lengths = sorted({len(o) for o in self.edits}, reverse=True)

    def _unjudged(self, old: Key) -> None:
        """Forget what the reply has shown of the edit of `old`: confirmed, in doubt, copied."""
        self.confirmed.discard(old)
        self.doubtful.discard(old)
        self.code_renames.discard(old)
        self._copied.pop(old, None)

    def _edit_at_pos(
        self, tokens: Sequence[int], pos: int, limit: int | None = None
    ) -> tuple[Key, Key] | None:
        """The learned edit whose old tokens start at `pos` (ending before `limit`), longest first."""
        end = len(tokens) if limit is None else limit
        for n in self._lengths:
            if pos + n <= end:
                old = tuple(tokens[pos : pos + n])
                new = self.edits.get(old)
                if new is not None:
                    return old, new
        return None
