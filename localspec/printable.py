"""Text from a GGUF or the hub, made safe to show on a terminal.

A model's name, its architecture, a hub file name or a path chosen by whoever made a
download can hold terminal escapes (clear the screen, retitle the window, plant a
hyperlink, move the cursor over earlier output) or bidi overrides that reorder what a
line seems to say. Every interface shows such strings through `printable`, which
writes those characters as visible escapes and leaves all other text as it is.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (0x9b alone is a CSI on some terminals), the bidi embeddings,
# overrides and isolates, the line and paragraph separators, and the lone surrogates that
# `surrogateescape` makes of bytes that are not UTF-8.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`str(text)` with every control, bidi and undecodable character written as a visible escape."""
    return _UNSAFE.sub(_escape, str(text))
