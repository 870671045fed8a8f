"""Other forms of the prompt's text that a reply copies, for the n-gram drafter to look up beside it.

A reply copies the prompt, but not always in the prompt's own form, and then the lookup matches
at most a line at a time (each line break differs):
- a JSON reply (a tool call's arguments, an answer to a schema) holds the copy as a JSON string,
  its line breaks and quotes escaped (`json_string_text`);
- coding agents show a file to the model with its lines numbered (`cat -n` and `nl -ba`: the
  number, then a tab; Claude Code's Read: then `→`; SWE-agent's viewer: then `:`), and the model
  writes the lines back without the numbers, in a code block or a tool call's arguments
  (`unnumbered_text`);
- the other way round, a prompt holds code or text as a JSON string (a tool's JSON result, an earlier
  tool call's arguments as the chat template renders them) and the reply writes it plainly
  (`json_decoded`).
Pure functions over text: the engine tokenizes what they give (`view_texts`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptView:
    """The prompt's text in another form, tokenized. `escaped`: the form a JSON string holds (only
    a reply that has escaped a character copies it, so it is looked up once the reply has)."""

    tokens: Sequence[int]
    escaped: bool = False


def json_string_text(text: str) -> str | None:
    """`text` as a JSON string's body holds it (quotes, backslashes and control characters escaped;
    other characters as they are, as models write them); None where that is `text` itself."""
    body = json.dumps(text, ensure_ascii=False)[1:-1]
    return None if body == text else body


# A JSON string on one line: its body, escapes and all (a raw line break ends the search).
_JSON_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
# Lines a JSON string must hold to be decoded: a shorter one is a message or a code literal's
# `"\n"` as likely as a file's text.
MIN_DECODED_LINES = 3
# One escape in a JSON string's body.
_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|.)")


@dataclass(frozen=True)
class Decoded:
    """The prompt's text with its JSON strings decoded (`json_decoded`), and where their escapes were."""

    text: str
    escapes: tuple[tuple[int, int], ...]  # in the text given, each escape's start and end (`\\n`, `\\u00e9`)


def json_decoded(text: str) -> Decoded | None:
    """`text` with each JSON string in it that holds MIN_DECODED_LINES lines or more (escaped line
    breaks) written as its value on a line of its own, without its quotes (its first line begins a
    line as the reply's copy will, and an agent's numbers on it are seen); None where there is none.
    A string that does not decode (a stray quote paired with the wrong one) is kept as it is.
    With it, where those strings' escapes are: a reply writing the strings plainly never copies
    them, so a draft from the prompt ends there."""
    parts: list[str] = []
    escapes: list[tuple[int, int]] = []
    at = 0
    for match in _JSON_STRING.finditer(text):
        if not _holds_lines(match):
            continue
        try:
            value = json.loads(match.group(0))
        except ValueError:
            continue
        parts += [text[at : match.start()], "\n", str(value)]
        at = match.end()
        body = match.start(1)
        escapes += [(body + e.start(), body + e.end()) for e in _ESCAPE.finditer(match.group(1))]
    if not parts:
        return None
    parts.append(text[at:])
    return Decoded("".join(parts), tuple(escapes))


def has_json_lines(text: str) -> bool:
    """Whether `text` holds a JSON string `json_decoded` would decode, without decoding it."""
    return any(_holds_lines(m) for m in _JSON_STRING.finditer(text))


def _holds_lines(match: re.Match[str]) -> bool:
    """Whether a JSON string (`_JSON_STRING`'s match) holds MIN_DECODED_LINES lines or more."""
    return match.group(1).count("\\n") >= MIN_DECODED_LINES - 1


# A numbered line: spaces, its number, and the mark after it.
_NUMBERED = re.compile(r" *(\d{1,7})(\t|→|:)")
# Lines numbered in a row: fewer is a list or a few timestamps as likely as a file's view.
MIN_NUMBERED_RUN = 3
# Three lines in a row numbered with one mark: a cheap test before anything is split or decoded.
_RUN_HINT = re.compile(r"^ *\d{1,7}(\t|→|:).*\n *\d{1,7}\1.*\n *\d{1,7}\1", re.MULTILINE)


def has_numbered_lines(text: str) -> bool:
    """Whether `text` may hold numbered lines (`unnumbered_text` says for sure), at a regex's cost."""
    return _RUN_HINT.search(text) is not None


def numbered_spans(text: str) -> list[tuple[int, int]]:
    """Where the numbers are in `text` (start and end of each line's spaces, number and mark), in
    every run of lines numbered one after the other: at least MIN_NUMBERED_RUN, one mark after the
    numbers; blank lines unnumbered inside a run, as `nl` leaves them, keep it going."""
    spans: list[tuple[int, int]] = []
    run: list[tuple[int, int]] = []
    mark, expect, at = "", -1, 0

    def close() -> None:
        if len(run) >= MIN_NUMBERED_RUN:
            spans.extend(run)
        run.clear()

    for line in text.split("\n"):
        m = _NUMBERED.match(line)
        if m is not None and m.group(2) == mark and int(m.group(1)) == expect:
            run.append((at, at + m.end()))
            expect += 1
        elif m is not None:
            close()
            run.append((at, at + m.end()))
            mark, expect = m.group(2), int(m.group(1)) + 1
        elif not (run and not line.strip()):
            close()
            mark, expect = "", -1
        at += len(line) + 1
    close()
    return spans


def unnumbered_text(text: str) -> str | None:
    """`text` with its numbered lines' numbers taken off (`numbered_spans`); None where it has none."""
    spans = numbered_spans(text)
    return _without(text, spans) if spans else None


def _without(text: str, spans: Sequence[tuple[int, int]]) -> str:
    kept, at = [], 0
    for start, end in spans:
        kept.append(text[at:start])
        at = end
    kept.append(text[at:])
    return "".join(kept)


def skipped_tokens(pieces: Sequence[bytes], text: str, spans: Sequence[tuple[int, int]]) -> frozenset[int]:
    """The positions of the tokens (their bytes `pieces`, which make up `text`) that hold a numbered
    line's number (`spans`, `numbered_spans(text)`): a reply writing the lines back never copies
    them, so a draft ends before them."""
    if not spans:
        return frozenset()
    # The spans in bytes, as the tokens are counted (a character may take several).
    in_bytes, at, offset = [], 0, 0
    for start, end in spans:
        offset += len(text[at:start].encode())
        width = len(text[start:end].encode())
        in_bytes.append((offset, offset + width))
        offset, at = offset + width, end
    skipped: set[int] = set()
    begin, j = 0, 0
    for i, piece in enumerate(pieces):
        end = begin + len(piece)
        while j < len(in_bytes) and in_bytes[j][1] <= begin:
            j += 1
        if j < len(in_bytes) and in_bytes[j][0] < end and begin < end:
            skipped.add(i)
        begin = end
    return frozenset(skipped)


def view_texts(
    text: str, json_reply: bool, spans: Sequence[tuple[int, int]], decoded: str | None = None
) -> list[tuple[str, bool]]:
    """The forms of the prompt's `text` a reply may copy besides its own, each with whether it is
    escaped: the text unnumbered (its numbers at `spans`, `numbered_spans(text)`), for any reply;
    for a JSON reply, the text as a JSON string holds it, unnumbered where it had numbers (the
    numbers escaped are no more copied than the plain); for any other, `decoded`, the text with its
    JSON strings decoded (`json_decoded`), unnumbered where they hold numbered lines (`cat -n`
    in a JSON result)."""
    unnumbered = _without(text, spans) if spans else None
    views: list[tuple[str, bool]] = [] if unnumbered is None else [(unnumbered, False)]
    if json_reply:
        escaped = json_string_text(text if unnumbered is None else unnumbered)
        if escaped is not None:
            views.append((escaped, True))
    elif decoded is not None:
        views.append((unnumbered_text(decoded) or decoded, False))
    return views
