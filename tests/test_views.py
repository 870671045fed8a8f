"""The prompt's other forms a reply copies: JSON-escaped, and with an agent's line numbers taken off."""

from __future__ import annotations

import json

import pytest

from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.drafters.views import (
    PromptView,
    has_json_lines,
    has_numbered_lines,
    json_decoded,
    json_string_text,
    numbered_spans,
    skipped_tokens,
    unnumbered_text,
    view_texts,
)

CODE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"


def decoded_text(text: str) -> str | None:
    """The text `json_decoded` gives, None where it decodes nothing."""
    decoded = json_decoded(text)
    return None if decoded is None else decoded.text


def numbered(text: str, mark: str, first: int = 1) -> str:
    """`text` as `cat -n` (mark a tab), Claude Code's Read (`→`) or SWE-agent (`:`) show it."""
    return "\n".join(f"{i:6d}{mark}{line}" for i, line in enumerate(text.split("\n"), first))


def test_json_string_text_is_what_a_json_string_holds_the_text_as() -> None:
    text = 'def f(x):\n    return "é\\t"\n'
    escaped = json_string_text(text)
    assert escaped == 'def f(x):\\n    return \\"é\\\\t\\"\\n'
    assert json.loads(f'"{escaped}"') == text
    assert json_string_text("plain words, nothing escaped") is None


@pytest.mark.parametrize("mark", ["\t", "→", ":"])
def test_numbered_lines_are_taken_back_to_the_file_s_own(mark: str) -> None:
    text = f"I ran `cat -n shapes.py`:\n\n{numbered(CODE, mark, first=40)}\n\nRename w to width."
    assert has_numbered_lines(text)
    assert unnumbered_text(text) == f"I ran `cat -n shapes.py`:\n\n{CODE}\n\nRename w to width."


def test_nl_s_unnumbered_blank_lines_keep_a_run_going() -> None:
    view = "     1\tdef f():\n\n     2\t    x = 1\n       \n     3\t    return x"
    assert unnumbered_text(view) == "def f():\n\n    x = 1\n       \n    return x"


@pytest.mark.parametrize(
    "text",
    [
        "1: eggs\n2: flour\nthen bake",  # two lines: a list as likely as a file
        "     1\tx = 1\n     3\ty = 2\n     4\tz = 3",  # not one after the other
        "     1\tx = 1\n     2:y = 2\n     3\tz = 3",  # two marks
        "Meeting at 10:30\nLunch at 12:00\nDone by 17:45",  # numbers inside lines
        CODE,
    ],
)
def test_text_without_a_numbered_run_has_no_unnumbered_form(text: str) -> None:
    assert unnumbered_text(text) is None


def test_two_runs_are_each_unnumbered_and_the_text_between_kept() -> None:
    first, second = numbered("a\nb\nc", "\t"), numbered("x\ny\nz", "\t", first=90)
    text = f"{first}\nand later:\n{second}"
    assert unnumbered_text(text) == "a\nb\nc\nand later:\nx\ny\nz"


def test_view_texts_by_reply_and_prompt() -> None:
    shown = numbered(CODE, "→")
    plain = json_string_text(CODE)
    assert plain is not None
    assert view_texts(CODE, False, numbered_spans(CODE)) == []
    assert view_texts(CODE, True, numbered_spans(CODE)) == [(plain, True)]
    assert view_texts(shown, False, numbered_spans(shown)) == [(CODE, False)]
    assert view_texts(shown, True, numbered_spans(shown)) == [(CODE, False), (plain, True)]
    # A JSON result holding the file: decoded for a plain reply; a JSON reply copies it as it is.
    result = "read_file returned " + json.dumps({"path": "shapes.py", "content": CODE})
    decoded = decoded_text(result)
    assert decoded is not None
    assert view_texts(result, False, numbered_spans(result), decoded) == [(decoded, False)]
    assert view_texts(result, False, numbered_spans(result)) == []  # the request holds no such string
    assert view_texts(result, True, numbered_spans(result)) == [(json_string_text(result), True)]


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def _copy_across_a_break(prompt: list[int], view: str, auto: bool) -> str:
    """A reply writing CODE back in a code block, up to a line's break: checks that the drafter
    looking up `view` drafts the next line as it is, and gives what the context alone drafts."""
    copied = CODE.index("h):\n    return 2")
    tokens = [*prompt, *_chars("```python\n" + CODE[:copied])]
    make = NgramDrafter.for_auto if auto else NgramDrafter
    drafter = make(text=chr, views=[PromptView(_chars(view))])
    drafter.start(prompt)
    for end in range(len(prompt) + 1, len(tokens) + 1):  # as the reply comes, token by token
        drafter.peek(tokens[:end], 16)
    match = drafter.peek(tokens, 16)
    assert "".join(map(chr, match.tokens)) == CODE[copied : copied + 16]
    assert match.match_len > 8
    plain = make(text=chr)
    plain.start(prompt)
    return "".join(map(chr, plain.peek(tokens, 16).tokens))


@pytest.mark.parametrize("auto", [False, True])
def test_a_reply_writing_a_numbered_file_back_drafts_across_its_lines(auto: bool) -> None:
    # An agent showed the file numbered: the reply writes its lines without the numbers, so the
    # context's own lookup matches back only to the line's start and then proposes the next line's
    # number; the unnumbered view matches across the lines and drafts the next one as it is.
    shown = numbered(CODE, "\t")
    prompt_text = f"cat -n shapes.py\n{shown}\nAdd docstrings."
    prompt = _chars(prompt_text)
    unnumbered = unnumbered_text(prompt_text)
    assert unnumbered is not None
    # Without it, the lookup copies the line's number after its break.
    assert "     6\t" in _copy_across_a_break(prompt, unnumbered, auto)


def test_numbered_spans_are_where_each_line_s_number_is() -> None:
    text = "head\n     1\tx = 1\n     2\ty = 2\n     3\tz = 3\ntail"
    spans = numbered_spans(text)
    assert [text[a:b] for a, b in spans] == ["     1\t", "     2\t", "     3\t"]


def test_skipped_tokens_are_those_holding_a_number_counted_in_bytes() -> None:
    # Pieces as a tokenizer might cut them: the arrow takes three bytes, a piece may straddle.
    text = "é\n     1→a\n     2→b\n     3→c"
    pieces = [
        b"\xc3\xa9\n",
        b"     1",
        "→".encode(),
        b"a\n  ",
        b"   2",
        "→b".encode(),
        b"\n",
        b"     3",
        b"\xe2",
        b"\x86\x92c",
    ]
    assert b"".join(pieces).decode() == text
    assert skipped_tokens(pieces, text, numbered_spans(text)) == {1, 2, 3, 4, 5, 7, 8, 9}
    assert (
        skipped_tokens([b"no numbers\n", b"here"], "no numbers\nhere", numbered_spans("no numbers\nhere"))
        == frozenset()
    )


def test_a_draft_from_the_context_ends_before_a_number_the_copy_skips() -> None:
    # The reply writes a numbered file back: the context's own match (its tokens split at a line's
    # end as the numbered prompt's are, so it matches longer than the view) runs into the next
    # line's number; it ends there, and where the number is its first token it is no match at all.
    prompt_text = "cat -n f.py\n" + numbered("value = 1\nother = 2\nthird = 3", "\t") + "\nEdit it."
    prompt = _chars(prompt_text)
    skipped = [i for a, b in numbered_spans(prompt_text) for i in range(a, b)]
    reply = _chars("```python\nvalue = 1\nother")
    drafter = NgramDrafter(text=chr, skipped=skipped)
    drafter.start(prompt)
    match = drafter.peek([*prompt, *reply], 8)
    assert "".join(map(chr, match.tokens)) == " = 2\n"
    at_number = drafter.peek([*prompt, *reply, *_chars(" = 2\n")], 8)
    assert at_number.tokens == []
    unskipped = NgramDrafter(text=chr)
    unskipped.start(prompt)
    assert "".join(map(chr, unskipped.peek([*prompt, *reply], 8).tokens)) == " = 2\n   "


def test_json_strings_holding_lines_are_written_as_their_values() -> None:
    result = json.dumps({"path": "shapes.py", "content": CODE, "note": "two\nlines"}, ensure_ascii=False)
    assert has_json_lines(result)
    assert decoded_text(result) == f'{{"path": "shapes.py", "content": \n{CODE}, "note": "two\\nlines"}}'
    # Fewer lines than a file's: a message or a code literal's "\n", kept as it is.
    for text in ['print("usage:\\n  run it")', CODE, "no strings here"]:
        assert not has_json_lines(text)
        assert decoded_text(text) is None
    # An escape JSON does not know (a regex in code, a quote paired with the wrong one) stays.
    odd = '"\\d+\\n\\s\\n\\w"'
    assert has_json_lines(odd)
    assert decoded_text(odd) is None


def test_numbered_lines_inside_a_json_result_are_taken_off_too() -> None:
    result = json.dumps({"output": numbered(CODE, "\t")})
    assert not has_numbered_lines(result)  # its lines are escaped: one line of text
    decoded = decoded_text(result)
    assert view_texts(result, False, [], decoded) == [(f'{{"output": \n{CODE}}}', False)]


@pytest.mark.parametrize("auto", [False, True])
def test_a_reply_writing_a_json_held_file_plainly_drafts_across_its_lines(auto: bool) -> None:
    # A tool returned the file in a JSON string: the reply writes it plainly, so the context's own
    # lookup matches back only to the line's start (the prompt has `\n` where the reply breaks the
    # line) and proposes the escape; the decoded view drafts the next line as it is.
    prompt_text = "read_file returned " + json.dumps({"content": CODE}) + "\nAdd docstrings."
    prompt = _chars(prompt_text)
    decoded = decoded_text(prompt_text)
    assert decoded is not None
    assert "\\n" in _copy_across_a_break(prompt, decoded, auto)


def test_escape_spans_are_the_escapes_of_the_strings_decoded() -> None:
    text = '{"note": "a\\"b", "content": "x = \\"1\\"\\ny = 2\\nz = 3\\u00e9"}'
    decoded = json_decoded(text)
    assert decoded is not None
    assert [text[a:b] for a, b in decoded.escapes] == ['\\"', '\\"', "\\n", "\\n", "\\u00e9"]
    assert json_decoded('{"note": "one\\nline"}') is None  # no string decoded, no escape to skip


def test_a_context_draft_ends_before_an_escape_a_plain_copy_never_writes() -> None:
    # Within a line the reply matches the JSON string as far back as the decoded view, and the
    # context's match, kept on a tie, ran on into the string's `\n`: it ends before the escape.
    prompt_text = "read_file returned " + json.dumps({"content": CODE}) + "\nAdd docstrings."
    prompt = _chars(prompt_text)
    found = json_decoded(prompt_text)
    assert found is not None
    skipped = [i for a, b in found.escapes for i in range(a, b)]
    decoded = found.text
    reply = [*prompt, *_chars("It does: return w")]  # a match within a line
    drafter = NgramDrafter(text=chr, views=[PromptView(_chars(decoded))], skipped=skipped)
    drafter.start(prompt)
    assert "".join(map(chr, drafter.peek(reply, 8).tokens)) == " * h"
    unskipped = NgramDrafter(text=chr, views=[PromptView(_chars(decoded))])
    unskipped.start(prompt)
    assert "".join(map(chr, unskipped.peek(reply, 8).tokens)) == " * h\\n\\n"
