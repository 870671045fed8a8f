"""A custom tool's Lark grammar as one regular expression (engine.lark_regex), and that regular
expression held by llguidance inside a JSON string, escaped, as a tool call carries the input."""

from __future__ import annotations

import json
import re
from typing import ClassVar

import llguidance
import pytest

from localspec.engine.constraint import JSON_OPTIONS
from localspec.engine.lark_regex import lark_regex
from localspec.errors import UserInputError

# Codex's apply_patch tool's grammar, byte for byte as codex-rs sends it (tool_apply_patch.lark).
APPLY_PATCH = r"""start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

# core/src/tools/handlers/tool_apply_patch.lark
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""
PATCH = """*** Begin Patch
*** Update File: src/app.py
@@ def greet(name):
-    return "hi " + name
+    return f"hello, {name}" \\ 'quoted'
*** Add File: notes.txt
+first line
+	tabbed "line"
*** Delete File: old.py
*** End Patch
"""


def _matches(grammar: str, text: str) -> bool:
    return re.fullmatch(lark_regex(grammar, "p"), text) is not None


def test_codexs_apply_patch_grammar_holds_a_patch_and_refuses_what_is_not_one() -> None:
    assert _matches(APPLY_PATCH, PATCH)
    assert _matches(APPLY_PATCH, PATCH.rstrip("\n"))  # the last LF is optional
    assert not _matches(
        APPLY_PATCH, PATCH.replace("*** Add File: notes.txt\n", "*** Add File: notes.txt\nx\n")
    )
    assert not _matches(APPLY_PATCH, "*** Begin Patch\n*** End Patch\n")  # no hunk
    assert not _matches(APPLY_PATCH, PATCH.replace("*** Begin Patch", "*** Begin patch"))


class _Bytes:
    """A tokenizer of one token a byte, so llguidance's matcher reads text exactly as given."""

    eos_token_id = 256
    bos_token_id = None
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids: ClassVar[list[int]] = [256]

    def __call__(self, text: str) -> list[int]:
        return list(text.encode())


def _held(pattern: str, value: str) -> bool:
    """Whether llguidance's JSON string, held to `pattern`, takes `value` as json.dumps writes it."""
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
    schema = json.dumps({"type": "string", "pattern": pattern})
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    return bool(matcher.consume_tokens(list(json.dumps(value).encode()))) and matcher.is_accepting()


def test_the_regular_expression_holds_the_escaped_json_string_a_call_carries() -> None:
    pattern = lark_regex(APPLY_PATCH, "p")
    # The patch's newlines, quotes, backslash and tab travel escaped; the grammar is over the text.
    assert "\\n" in json.dumps(PATCH) and '\\"' in json.dumps(PATCH)
    assert _held(pattern, PATCH)
    assert not _held(pattern, PATCH.replace("*** End Patch", "*** End"))
    # Anchored: nothing before or after the grammar's text.
    assert not _held(pattern, "note: " + PATCH)
    assert not _held(lark_regex('start: "ab"', "p"), "abab")


@pytest.mark.parametrize(
    ("grammar", "yes", "no"),
    [
        # strings with escapes, a case-insensitive one, a range
        (r'start: "a\"b" "\\" "x"i "0".."3"', ['a"b\\x2', 'a"b\\X0'], ['a"b\\x4', "ab\\x2"]),
        # regular expression flags, optional, repeats
        (r'start: /ab/i ["-"] "c"+ "d"* "e"?', ["ABccd", "Ab-c", "abcce"], ["abd", "ab--c"]),
        # Lark's ~ n and ~ n..m, llguidance's {n}, {n,}, {,m}, {n,m}
        ('start: "a" ~ 2 "b" ~ 1..2', ["aab", "aabb"], ["ab", "aabbb"]),
        ('start: "a"{2} "b"{1,} "c"{,1} "d"{1,2}', ["aabd", "aabbbcdd"], ["abd", "aabccd", "aab"]),
        # rules and terminals over several lines, aliases, comments, ?rule, !rule, priorities
        (
            'start: greeting (" " NAME)+  // a comment\n'
            '?greeting: "hi" -> hi\n    | "hello"  # another\n'
            "!NAME.2: /[a-z]+/\n",
            ["hi bob", "hello ann joe"],
            ["hi", "hey bob", "hi Bob"],
        ),
        # groups inside brackets across lines
        ('start: ("a"\n  | "b")+ "."', ["ab.", "bba."], ["c.", "ab"]),
        # lark's common terminals, one, aliased, several
        (
            'start: INT " " NUMBER " " W WS CNAME\n%import common.INT\n%import common.WORD -> W\n'
            "%import common (NUMBER, WS, CNAME)\n",
            ["12 3.5e2 abc \t\n_x9"],
            ["1.5 2 abc x", "12 3 ab1 x"],
        ),
        # llguidance's options are for its own parser: nothing to hold
        ('%llguidance {}\nstart: "ok"', ["ok"], ["no"]),
    ],
)
def test_each_construct_means_what_lark_says(grammar: str, yes: list[str], no: list[str]) -> None:
    pattern = lark_regex(grammar, "p")
    for text in yes:
        assert re.fullmatch(pattern, text), (grammar, text, pattern)
        assert _held(pattern, text), (grammar, text)
    for text in no:
        assert not re.fullmatch(pattern, text), (grammar, text, pattern)
        assert not _held(pattern, text), (grammar, text)


def test_a_common_terminals_own_names_do_not_meet_the_grammars() -> None:
    # common's INT is DIGIT+; the grammar's own DIGIT is not the one INT means.
    pattern = lark_regex('start: INT DIGIT\nDIGIT: "x"\n%import common.INT', "p")
    assert re.fullmatch(pattern, "42x") and not re.fullmatch(pattern, "424")


@pytest.mark.parametrize(
    ("grammar", "words"),
    [
        ('start: "(" start ")" | "x"', "recursive (start -> start)"),
        ('start: a\na: "x" b\nb: "y" a | "z"', "recursive (a -> b -> a)"),
        ('start: "a"\n%ignore " "', "%ignore"),
        ('start: %json {"type": "string"}', "%json"),
        ("start: <|im_end|>", "special tokens"),
        ('start: A & B\nA: "a"\nB: "b"', "operators"),
        ('start: "a" missing', "does not define it"),
        ('begin: "a"', "no `start` rule"),
        ('start: "a"\nstart: "b"', "defined twice"),
        ('start: "a"\n%import other.X', "only lark's common"),
        ("start: X\n%import common.NOPE -> X", "common has no 'NOPE'"),
        ('start: "ab".."c"', "one character to another"),
        ('start: "a" ~ x', "expected a number"),
        ('start: ("a"', "ends in the middle"),
    ],
)
def test_what_a_regular_expression_cannot_carry_is_refused_by_name(grammar: str, words: str) -> None:
    with pytest.raises(UserInputError) as caught:
        lark_regex(grammar, "tools.0.format.definition")
    assert words in caught.value.message and caught.value.param == "tools.0.format.definition"
    assert caught.value.message.startswith("tools.0.format.definition: ")
