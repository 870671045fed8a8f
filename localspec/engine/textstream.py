"""Turn token bytes into text safely: never split a UTF-8 character, stop at stop strings.

Text that might be the start of a stop string is held back until it is clear
that it is not, so a client never sees text that should have been cut. With a
`min_indent` (llama-server's n_indent, for code completion), a new line is held
until its indentation shows, and one indented less ends the text before it (the
newline kept, that line's whitespace dropped; llama-server keeps the whitespace).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Accumulates token pieces (bytes) and releases text that is final."""

    def __init__(self, stop: Sequence[str] = (), min_indent: int = 0) -> None:
        self._min_indent = min_indent
        self._at_line_start = False  # pending text begins a line (after the first newline only)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._hold_len = max((len(s) - 1 for s in self._stop), default=0)
        self._pending = ""
        self.text = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; return the newly final text ("" while a character or stop is unresolved)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: flush what was held back (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        cut = self._first_stop()
        indent_cut, line_start = self._indent()
        if indent_cut is not None and (cut is None or indent_cut < cut):
            cut, self.matched = indent_cut, None
        if cut is not None:
            out = self._pending[:cut]
            self._pending = ""
            self.stopped = True
        elif final:
            out, self._pending = self._pending, ""
        else:
            release = len(self._pending) - self._held_suffix()
            if line_start is not None:
                release = min(release, line_start)
            out = self._pending[:release]
            self._pending = self._pending[release:]
            self._at_line_start = release == line_start
        self.text += out
        return out

    def _indent(self) -> tuple[int | None, int | None]:
        """(where a line indented less than min_indent starts, where an undecided line starts)."""
        if self._min_indent <= 0:
            return None, None
        pending = self._pending
        starts = [0] if self._at_line_start else []
        starts += [i + 1 for i, c in enumerate(pending) if c == "\n"]
        for start in starts:
            end = start
            while end < len(pending) and pending[end] in " \t":
                end += 1
            if end == len(pending):
                return None, start
            if end - start < self._min_indent:
                return start, None
        return None, None

    def _first_stop(self) -> int | None:
        # Search the tail of the released text too: a stop string may straddle the boundary only
        # in pending text, because released text never ends with a stop-string prefix.
        hits = [(i, s) for i, s in ((self._pending.find(s), s) for s in self._stop) if i >= 0]
        if not hits:
            return None
        cut, self.matched = min(hits, key=lambda hit: hit[0])
        return cut

    def _held_suffix(self) -> int:
        """Length of the longest suffix of pending text that is a proper prefix of a stop string."""
        pending = self._pending
        for length in range(min(self._hold_len, len(pending)), 0, -1):
            tail = pending[-length:]
            if any(s.startswith(tail) for s in self._stop):
                return length
        return 0
