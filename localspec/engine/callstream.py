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
        self.consumed = 0  # raw characters read (where the value ends, once done)

    def feed(self, raw: str) -> str:
        """Read more raw text; return what is new of the canonical text. What follows the value
        (a call's closing brace and marker) is not read."""
        start = len(self.text)
        for ch in raw:
            if self.done:
                break
            self._read(ch)
            self.consumed += 1
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


# A call's head, up to where its arguments begin: `{"name": "...", "arguments": `.
def _head(args_key: str) -> re.Pattern[str]:
    return re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"' + re.escape(args_key) + r'"\s*:\s*')


_ARRAY_OPEN = re.compile(r"\s*\[")
_ARRAY_NEXT = re.compile(r"\s*\}\s*,")  # the call's object closed, the next one follows


class _Call:
    def __init__(self, name: str) -> None:
        self.name = name
        self.arguments = JsonStream()
        self.shown = False  # its name went out (a later call waits until it is surely no repeat)
        self.sent = 0  # characters of its arguments' text sent


class CallStreams:
    """The reply's calls, each streamed once its name is written and where its arguments follow it
    (a grammar writes them in that order; a call written otherwise goes whole at the end).

    Where each call begins: after its `start` marker (Hermes: `<tool_call>` before each); in one
    JSON array after the marker (Mistral: `[TOOL_CALLS][{...}, {...}]`); or at the reply's start
    (bare JSON: Llama 3's, one call). With `parallel`, calls after the first stream too; each
    waits until it differs from every earlier call to the same tool, since a call that repeats an
    earlier one word for word ends the reply and is dropped (ToolCallFilter.repeated): a client
    is never sent a call the reply does not hold."""

    def __init__(self, start: str, args_key: str, array: bool, parallel: bool) -> None:
        self.start = start
        self.head = _head(args_key)
        self.array = array
        self.parallel = parallel
        self.calls: list[_Call] = []
        self._read = 0  # characters of the reply read: where the next call is looked for

    def update(self, text: str) -> list[CallDelta]:
        """`text`: the reply so far. What is new of its calls, if anything."""
        out: list[CallDelta] = []
        while True:
            call = self.calls[-1] if self.calls else None
            if call is None or call.arguments.done:
                # After a repeat (whole and never shown) the reply ends: what follows it in the
                # same step is not a call the reply keeps.
                last = call is not None and (not self.parallel or not call.shown)
                if last or not self._open(text):
                    return out
                call = self.calls[-1]
            # Only the new text: a whole-file call is long, and this runs at every step.
            before = call.arguments.consumed
            call.arguments.feed(text[self._read :])
            self._read += call.arguments.consumed - before
            delta = self._delta(len(self.calls) - 1, call)
            if delta is not None:
                out.append(delta)
            if not call.arguments.done:
                return out

    def _open(self, text: str) -> bool:
        """Read the next call's head, where it is written yet."""
        at = self._read
        if self.array:
            if self.calls:
                sep = _ARRAY_NEXT.match(text, at)
            else:  # after the marker, or at the start where the marker is not text
                found = text.find(self.start, at)
                sep = _ARRAY_OPEN.match(text, found + len(self.start) if found >= 0 else at)
            if sep is None:
                return False
            at = sep.end()
        elif self.start:
            found = text.find(self.start, at)
            if found < 0:
                return False
            at = found + len(self.start)
        elif self.calls:
            return False  # bare JSON holds one call
        head = self.head.match(text, at)
        if head is None:
            return False
        try:
            name = json.loads(f'"{head.group(1)}"')
        except ValueError:
            return False
        self.calls.append(_Call(name))
        self._read = head.end()
        return True

    def _delta(self, index: int, call: _Call) -> CallDelta | None:
        text, done = call.arguments.text, call.arguments.done
        if not call.shown:
            if any(c.name == call.name and c.arguments.text.startswith(text) for c in self.calls[:index]):
                return None  # maybe a repeat: it waits
            call.shown = True
            call.sent = len(text)
            return CallDelta(index, call.name, text, done)
        piece, call.sent = text[call.sent :], len(text)
        return CallDelta(index, "", piece, done) if piece else None

    def shown(self) -> list[_Call]:
        """The calls whose pieces went out, in order."""
        return [c for c in self.calls if c.shown]


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
