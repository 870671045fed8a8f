"""A tool call's arguments streamed while the model writes them.

A call's text is held back from the content (`tooluse.ToolCallFilter`); without this a client saw
nothing of it until it closed, and a call that writes a whole file (an agent's write_file or
edit) is the reply's longest part: minutes of silence on a small CPU. Clients join a call's
argument deltas into its arguments, so every piece sent must be a prefix of the arguments the
reply ends with: `JsonStream` turns the raw JSON the model writes, piece by piece, into the
text `json.dumps(value, ensure_ascii=False)` gives for its value, never taking back what it gave.
"""

from __future__ import annotations

import json
import re

from localspec.types import CallDelta

_WHITESPACE = " \t\n\r"
_ATOM_END = ",}]" + _WHITESPACE
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _canonical(ch: str) -> str:
    """A string's character as json.dumps(ensure_ascii=False) writes it."""
    return json.dumps(ch, ensure_ascii=False)[1:-1]


class JsonStream:
    """One JSON value's canonical text (its raw text given in pieces); `done` once it is whole."""

    def __init__(self) -> None:
        self.text = ""  # the canonical text so far
        self.done = False
        self._stack: list[str] = []  # the open containers: "{" or "["
        self._expect = "value"  # value, key, colon, after, string, escape, atom
        self._escape = ""  # an escape sequence read so far (after the backslash)
        self._high = ""  # a high surrogate waiting for its low half
        self._atom = ""  # a number or literal read so far
        self._key = False  # the string being read is an object's key

    def feed(self, raw: str) -> str:
        """Read more raw text; return what is new of the canonical text. What follows the value
        (a call's closing brace and marker) is not read."""
        start = len(self.text)
        for ch in raw:
            if self.done:
                break
            self._read(ch)
        return self.text[start:]

    def finish(self) -> str:
        """The end of the raw text: a number or literal waiting for its delimiter is complete."""
        start = len(self.text)
        if self._expect == "atom":
            self._end_atom()
        return self.text[start:]

    def _read(self, ch: str) -> None:
        expect = self._expect
        if expect == "string":
            self._string(ch)
        elif expect == "escape":
            self._escaped(ch)
        elif expect == "atom" and ch not in _ATOM_END:
            self._atom += ch
        else:
            if expect == "atom":
                self._end_atom()
            if ch not in _WHITESPACE:
                self._structural(ch)

    def _structural(self, ch: str) -> None:
        if ch in "}]" and self._stack:
            self._stack.pop()
            self._emit(ch)
            self._value_ended()
        elif ch == ",":
            self._emit(", ")
            self._expect = "key" if self._stack and self._stack[-1] == "{" else "value"
        elif ch == ":":
            self._emit(": ")
            self._expect = "value"
        elif ch in "{[":
            self._stack.append(ch)
            self._emit(ch)
            self._expect = "key" if ch == "{" else "value"
        elif ch == '"':
            self._emit('"')
            self._key = self._expect == "key"
            self._expect = "string"
        else:
            self._atom = ch
            self._expect = "atom"

    def _string(self, ch: str) -> None:
        if ch == "\\":
            self._expect, self._escape = "escape", ""
        elif ch == '"':
            self._flush_high()
            self._emit('"')
            if self._key:  # a key is followed by its colon; a value ends here
                self._expect = "colon"
            else:
                self._value_ended()
        else:
            self._char(ch)

    def _escaped(self, ch: str) -> None:
        self._escape += ch
        if self._escape[0] != "u":
            self._expect = "string"
            self._char(_ESCAPES.get(self._escape, self._escape))
        elif len(self._escape) == 5:
            self._expect = "string"
            digits = self._escape[1:]
            if all(c in "0123456789abcdefABCDEF" for c in digits):
                self._char(chr(int(digits, 16)))
            else:  # not JSON; the call's parse will say so
                self._emit("\\" + self._escape)

    def _char(self, ch: str) -> None:
        """A string's decoded character; surrogate halves joined as json.loads joins them."""
        if "\ud800" <= ch <= "\udbff":
            self._flush_high()
            self._high = ch
            return
        if self._high and "\udc00" <= ch <= "\udfff":
            ch = (self._high + ch).encode("utf-16", "surrogatepass").decode("utf-16")
            self._high = ""
        self._flush_high()
        self._emit(_canonical(ch))

    def _flush_high(self) -> None:
        if self._high:
            self._emit(_canonical(self._high))
            self._high = ""

    def _end_atom(self) -> None:
        try:
            value = json.loads(self._atom)
        except ValueError:
            value = self._atom  # not JSON; the call's parse will say so
        self._emit(json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value)
        self._atom = ""
        self._value_ended()

    def _value_ended(self) -> None:
        self._expect = "after"
        if not self._stack:
            self.done = True

    def _emit(self, text: str) -> None:
        self.text += text


# A wrapped call's head, up to where its arguments begin: `{"name": "...", "arguments": `.
def _head(args_key: str) -> re.Pattern[str]:
    return re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"' + re.escape(args_key) + r'"\s*:\s*')


class FirstCall:
    """The reply's first call (after its `start` marker), streamed once its name is written and
    where its arguments follow it (a grammar writes them in that order); a call written otherwise
    goes whole at the end, as before."""

    def __init__(self, start: str, args_key: str) -> None:
        self.start = start
        self.head = _head(args_key)
        self.name: str | None = None
        self.arguments = JsonStream()
        self._body_at: int | None = None  # where the call's text begins in the reply
        self._read = 0  # characters of the reply the arguments' stream was given, once they began

    def update(self, text: str) -> CallDelta | None:
        """`text`: the reply so far. What is new of the call, if anything."""
        if self._body_at is None:
            found = text.find(self.start)
            if found < 0:
                return None
            self._body_at = found + len(self.start)
        first = self.name is None
        if first:
            head = self.head.match(text, self._body_at)
            if head is None:
                return None
            try:
                self.name = json.loads(f'"{head.group(1)}"')
            except ValueError:
                return None
            self._read = head.end()
        # Only the new text: a whole-file call is long, and this runs at every step.
        piece = self.arguments.feed(text[self._read :])
        self._read = len(text)
        if not first and not piece:
            return None
        return CallDelta(0, (self.name or "") if first else "", piece)


class FieldText:
    """One string field's text, decoded as the canonical JSON of its object streams (a custom
    tool's call is `{"input": "..."}`; its client is sent the input, not the JSON). Where the
    arguments begin otherwise, nothing is given: the input then goes whole when the call ends."""

    def __init__(self, key: str) -> None:
        self.head = "{" + json.dumps(key, ensure_ascii=False) + ': "'
        self.text = ""  # the field's text so far
        self._raw = ""
        self._at = 0  # where in _raw the undecoded text begins, once past the head
        self._ended = False

    def feed(self, piece: str) -> str:
        """More of the arguments' canonical text; what is new of the field's text."""
        self._raw += piece
        if self._at == 0:
            if not self._raw.startswith(self.head):
                if not self.head.startswith(self._raw):
                    self._ended = True  # not the one-field object: nothing streams
                return ""
            self._at = len(self.head)
        start = len(self.text)
        raw, at = self._raw, self._at
        while at < len(raw) and not self._ended:
            ch = raw[at]
            if ch == '"':
                self._ended = True
            elif ch != "\\":
                self.text += ch
                at += 1
            elif at + 1 < len(raw) and raw[at + 1] != "u":
                self.text += _ESCAPES.get(raw[at + 1], raw[at + 1])
                at += 2
            elif at + 6 <= len(raw):
                digits = raw[at + 2 : at + 6]
                hexed = all(c in "0123456789abcdefABCDEF" for c in digits)
                self.text += chr(int(digits, 16)) if hexed else raw[at : at + 6]  # not JSON: as written
                at += 6
            else:
                break  # an escape cut by the piece's end: the next piece completes it
        self._at = at
        return self.text[start:]
