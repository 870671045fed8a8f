"""A call's arguments streamed as written: every piece a prefix of json.dumps of the whole value."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.engine.callstream import FieldText, JsonStream
from localspec.engine.toolcalls import HERMES
from localspec.engine.tooluse import ToolCallFilter
from localspec.server.responses import json_bytes
from localspec.types import CallDelta, GenerationResult, GenerationStats

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_values = st.recursive(
    _scalars | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_objects = st.dictionaries(_text, _values, max_size=5)


def _streamed(raw: str, cuts: list[int]) -> tuple[str, JsonStream]:
    stream, at, out = JsonStream(), 0, ""
    for cut in sorted(c % (len(raw) + 1) for c in cuts):
        out += stream.feed(raw[at:cut])
        at = max(at, cut)
    out += stream.feed(raw[at:]) + stream.finish()
    return out, stream


@settings(max_examples=400)
@given(
    _objects,
    st.lists(st.integers(min_value=0), max_size=8),
    st.sampled_from([(", ", ": "), (",", ":"), (" , ", " :  ")]),
    st.booleans(),
    st.sampled_from([None, 2]),
)
def test_the_pieces_join_into_the_canonical_text_however_the_raw_text_is_written_and_cut(
    value: dict[str, Any], cuts: list[int], separators: tuple[str, str], ascii_only: bool, indent: int | None
) -> None:
    raw = json.dumps(value, separators=separators, ensure_ascii=ascii_only, indent=indent)
    out, stream = _streamed(raw, cuts)
    assert out == json.dumps(json.loads(raw), ensure_ascii=False) and stream.done


def test_what_follows_the_value_is_not_read() -> None:
    stream = JsonStream()
    assert stream.feed('{"path": "a.py", "n": 1') == '{"path": "a.py", "n": '
    assert stream.feed("0}}\n</tool_call>") == "10}" and stream.done
    assert stream.feed("more") == "" and stream.text == '{"path": "a.py", "n": 10}'


def test_a_string_streams_character_by_character_and_escapes_as_json_dumps() -> None:
    stream = JsonStream()
    pieces = [stream.feed(ch) for ch in r'{"body":"line\n\u00e9\/\ud83d\ude00"}']
    assert "".join(pieces) == json.dumps({"body": "line\né/😀"}, ensure_ascii=False)
    # The text goes out as it comes: each of the string's characters when read (an escape when whole).
    assert pieces[9:12] == ["l", "i", "n"] and pieces[13] == "" and pieces[14] == "\\n"


def test_numbers_wait_for_their_end_and_are_written_as_python_writes_them() -> None:
    stream = JsonStream()
    assert stream.feed('{"x": 1.50') == '{"x": '
    assert stream.feed("e2, ") == "150.0, "
    assert stream.feed('"y": tru') == '"y": '
    assert stream.feed("e}") == "true}" and stream.done


def _result(text: str, finish: str = "stop") -> GenerationResult:
    return GenerationResult(text, (), finish, GenerationStats())  # type: ignore[arg-type]


def test_the_first_call_streams_through_the_filter_and_ends_as_the_text_it_streamed() -> None:
    calls = ToolCallFilter(HERMES, parallel=True, stream_calls=True)
    reply = (
        'Sure.<tool_call>\n{"name": "write", "arguments": {"path": "a.py", "body": "x\\u00e9"}}\n</tool_call>'
    )
    content, pieces = "", []
    for ch in reply:
        content += calls.push(ch)
        delta = calls.call_delta()
        if delta is not None:
            pieces.append(delta)
    assert content == "Sure." and pieces[0].name == "write" and all(p.name == "" for p in pieces[1:])
    joined = "".join(p.arguments for p in pieces)
    assert joined == json.dumps({"path": "a.py", "body": "xé"}, ensure_ascii=False)
    tail, result = calls.finish(_result(reply))
    assert tail == "" and result.tool_calls[0].arguments == joined and result.finish_reason == "tool_calls"


def test_a_cut_call_leaves_neither_a_call_nor_its_raw_text() -> None:
    calls = ToolCallFilter(HERMES, parallel=False, stream_calls=True)
    reply = 'ok<tool_call>\n{"name": "write", "arguments": {"path": "a.'
    assert calls.push(reply) == "ok" and calls.call_delta() == CallDelta(0, "write", '{"path": "a.')
    tail, result = calls.finish(_result(reply, "length"))
    assert tail == "" and result.text == "ok" and not result.tool_calls and result.finish_reason == "length"


def test_without_streaming_nothing_changes() -> None:
    calls = ToolCallFilter(HERMES, parallel=False)
    reply = '<tool_call>\n{"name": "write", "arguments": {"path": "a.'
    assert calls.push(reply) == "" and calls.call_delta() is None
    assert calls.finish(_result(reply, "length"))[0] == reply


# --- a custom tool's input: the text of its one field, decoded as its JSON streams ------------


@settings(max_examples=300)
@given(st.text(max_size=40), st.lists(st.integers(min_value=0), max_size=8))
def test_a_fields_text_streams_as_its_objects_canonical_json_does_however_cut(
    text: str, cuts: list[int]
) -> None:
    canonical = json.dumps({"input": text}, ensure_ascii=False)
    field, at, pieces = FieldText("input"), 0, []
    for cut in [*sorted(c % (len(canonical) + 1) for c in cuts), len(canonical)]:
        pieces.append(field.feed(canonical[at:cut]))
        at = max(at, cut)
    assert "".join(pieces) == field.text == text


def test_an_escape_cut_between_pieces_waits_for_its_end() -> None:
    field = FieldText("input")
    assert [field.feed(p) for p in ['{"inp', 'ut": "ls', " -l \\", "n\\u00", '1f"}']] == [
        "",
        "ls",
        " -l ",
        "\n",
        "\x1f",
    ]


def test_a_lone_surrogate_streams_and_its_body_is_still_json() -> None:
    stream, field = JsonStream(), FieldText("input")
    text = field.feed(stream.feed('{"input": "a\\ud800b"}'))
    assert text == "a\ud800b" and json.loads(json_bytes({"delta": text})) == {"delta": text}


def test_arguments_that_are_not_the_one_field_object_stream_nothing() -> None:
    field = FieldText("input")
    assert field.feed('{"cmd": "ls"}') == "" and field.feed("more") == "" and field.text == ""
