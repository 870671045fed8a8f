"""A call's arguments streamed as written: every piece a prefix of json.dumps of the whole value."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.engine.callstream import FieldText, JsonStream
from localspec.engine.toolcalls import HERMES, LLAMA3, MISTRAL
from localspec.engine.tooluse import ToolCallFilter
from localspec.server.responses import json_bytes
from localspec.server.toolschemas import custom_input
from localspec.types import CallDelta, GenerationResult, GenerationStats, ToolCall

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
    content, pieces = "", list[CallDelta]()
    for ch in reply:
        content += calls.push(ch)
        pieces.extend(calls.call_deltas())
    assert content == "Sure." and pieces[0].name == "write" and all(p.name == "" for p in pieces[1:])
    joined = "".join(p.arguments for p in pieces)
    assert joined == json.dumps({"path": "a.py", "body": "xé"}, ensure_ascii=False)
    tail, result = calls.finish(_result(reply))
    assert tail == "" and result.tool_calls[0].arguments == joined and result.finish_reason == "tool_calls"


def test_a_cut_call_leaves_neither_a_call_nor_its_raw_text() -> None:
    calls = ToolCallFilter(HERMES, parallel=False, stream_calls=True)
    reply = 'ok<tool_call>\n{"name": "write", "arguments": {"path": "a.'
    assert calls.push(reply) == "ok" and calls.call_deltas() == (CallDelta(0, "write", '{"path": "a.'),)
    tail, result = calls.finish(_result(reply, "length"))
    assert tail == "" and result.text == "ok" and not result.tool_calls and result.finish_reason == "length"
    assert result.cut_call == ToolCall("write", '{"path": "a.') and result.calls_shown() == (result.cut_call,)


def test_without_streaming_nothing_changes() -> None:
    calls = ToolCallFilter(HERMES, parallel=False)
    reply = '<tool_call>\n{"name": "write", "arguments": {"path": "a.'
    assert calls.push(reply) == "" and calls.call_deltas() == ()
    assert calls.finish(_result(reply, "length"))[0] == reply


def _stream(calls: ToolCallFilter, reply: str, step: int = 3) -> tuple[str, list[CallDelta]]:
    """The reply pushed a few characters a step: its content and the call pieces streamed."""
    content, pieces = "", list[CallDelta]()
    for at in range(0, len(reply), step):
        content += calls.push(reply[at : at + step])
        pieces.extend(calls.call_deltas())
    return content, pieces


def _joined(pieces: list[CallDelta]) -> dict[int, tuple[str, str]]:
    out: dict[int, tuple[str, str]] = {}
    for p in pieces:
        name, arguments = out.get(p.index, ("", ""))
        assert (p.name != "") == (p.index not in out)  # the name with a call's first piece only
        out[p.index] = (name or p.name, arguments + p.arguments)
    return out


def _wrapped(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def test_parallel_calls_each_stream_with_their_index() -> None:
    calls = ToolCallFilter(HERMES, parallel=True, stream_calls=True)
    reply = _wrapped("read", '{"path": "a.py"}') + "\n" + _wrapped("read", '{"path": "b.py"}')
    content, pieces = _stream(calls, reply)
    assert content == "" and _joined(pieces) == {
        0: ("read", '{"path": "a.py"}'),
        1: ("read", '{"path": "b.py"}'),
    }
    # A step's pieces of one call come as one; the second's start after the first's end.
    assert [p.index for p in pieces] == sorted(p.index for p in pieces)
    _, result = calls.finish(_result(reply))
    assert [(c.name, c.arguments) for c in result.tool_calls] == [
        ("read", '{"path": "a.py"}'),
        ("read", '{"path": "b.py"}'),
    ]


def test_a_call_repeating_an_earlier_one_is_never_sent() -> None:
    calls = ToolCallFilter(HERMES, parallel=True, stream_calls=True)
    first = _wrapped("read", '{"path": "a.py"}')
    _, pieces = _stream(calls, first + "\n" + first)
    assert calls.repeated()  # the reply ends here (the worker ends it), the repeat dropped
    assert _joined(pieces) == {0: ("read", '{"path": "a.py"}')}
    _, result = calls.finish(_result(first + "\n" + first))
    assert [c.arguments for c in result.tool_calls] == ['{"path": "a.py"}']


def test_a_later_call_waits_while_it_may_be_a_repeat_then_streams_from_its_start() -> None:
    calls = ToolCallFilter(HERMES, parallel=True, stream_calls=True)
    _, pieces = _stream(
        calls,
        _wrapped("read", '{"path": "a.py"}') + '\n<tool_call>\n{"name": "read", "arguments": {"path": "a.',
    )
    assert set(_joined(pieces)) == {0}  # the second is so far word for word the first
    calls.push("txt")
    (piece,) = calls.call_deltas()
    assert piece == CallDelta(1, "read", '{"path": "a.txt')


def test_a_cut_later_call_leaves_the_calls_before_it() -> None:
    calls = ToolCallFilter(HERMES, parallel=True, stream_calls=True)
    reply = _wrapped("read", '{"path": "a.py"}') + '\n<tool_call>\n{"name": "write", "arguments": {"path": "b'
    _, pieces = _stream(calls, reply)
    assert _joined(pieces) == {0: ("read", '{"path": "a.py"}'), 1: ("write", '{"path": "b')}
    tail, result = calls.finish(_result(reply, "length"))
    assert tail == "" and result.text == "" and result.finish_reason == "length"
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("read", '{"path": "a.py"}')]
    assert result.cut_call == ToolCall("write", '{"path": "b')


def test_without_parallel_calls_only_the_first_streams() -> None:
    calls = ToolCallFilter(HERMES, parallel=False, stream_calls=True)
    reply = _wrapped("read", '{"path": "a.py"}') + "\n" + _wrapped("read", '{"path": "b.py"}')
    assert set(_joined(_stream(calls, reply)[1])) == {0}


def test_a_bare_llama3_call_streams() -> None:
    calls = ToolCallFilter(LLAMA3, parallel=False, stream_calls=True)
    reply = '{"name": "write", "parameters": {"path": "a.py", "body": "x = 1\\n"}}'
    content, pieces = _stream(calls, reply, step=2)
    assert content == "" and _joined(pieces) == {0: ("write", '{"path": "a.py", "body": "x = 1\\n"}')}
    _, result = calls.finish(_result(reply))
    assert result.tool_calls[0].arguments == _joined(pieces)[0][1]


def test_a_mistral_array_streams_each_call_and_a_cut_keeps_the_whole_ones() -> None:
    one, two = '{"name": "read", "arguments": {"path": "a"}}', '{"name": "read", "arguments": {"path": "b"}}'
    reply = f"[TOOL_CALLS] [{one}, {two}]"
    calls = ToolCallFilter(MISTRAL, parallel=True, stream_calls=True)
    _, pieces = _stream(calls, reply)
    assert _joined(pieces) == {0: ("read", '{"path": "a"}'), 1: ("read", '{"path": "b"}')}
    assert [c.arguments for c in calls.finish(_result(reply))[1].tool_calls] == [
        '{"path": "a"}',
        '{"path": "b"}',
    ]
    # Cut in the second call: the array's parse is lost, the first call stands as it streamed.
    cut = ToolCallFilter(MISTRAL, parallel=True, stream_calls=True)
    _stream(cut, reply[:-12])
    _, result = cut.finish(_result(reply[:-12], "length"))
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("read", '{"path": "a"}')]


_call_values = st.lists(
    st.tuples(
        st.sampled_from(["read", "write"]),
        st.dictionaries(st.sampled_from(["path", "n", "body"]), _values, max_size=2),
    ),
    min_size=1,
    max_size=4,
)


def _reply(fmt_name: str, calls: list[tuple[str, dict[str, Any]]], separators: tuple[str, str]) -> str:
    bodies = [json.dumps({"name": n, "arguments": a}, separators=separators) for n, a in calls]
    if fmt_name == "mistral":
        return "[TOOL_CALLS] [" + ", ".join(bodies) + "]"
    return "Sure. " + "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in bodies)


@settings(max_examples=300)
@given(
    st.sampled_from(["hermes", "mistral"]),
    _call_values,
    st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=60),
    st.sampled_from([(", ", ": "), (",", ":")]),
    st.one_of(st.none(), st.integers(min_value=0)),
)
def test_streamed_calls_always_join_into_the_calls_the_reply_ends_with(
    fmt_name: str,
    values: list[tuple[str, dict[str, Any]]],
    steps: list[int],
    separators: tuple[str, str],
    cut: int | None,
) -> None:
    # However the reply comes in steps, is cut, or repeats a call (the worker ends a Hermes reply
    # there): every call the result holds that streamed is exactly its pieces, under its index,
    # and at most one more, cut by the token limit, streamed a start of itself.
    fmt = MISTRAL if fmt_name == "mistral" else HERMES
    reply = _reply(fmt_name, values, separators)
    if cut is not None:
        reply = reply[: cut % (len(reply) + 1)]
    calls, pushed, pieces, at = (
        ToolCallFilter(fmt, parallel=True, stream_calls=True),
        "",
        list[CallDelta](),
        0,
    )
    for step in steps * (len(reply) // sum(steps) + 1):
        if at >= len(reply):
            break
        pushed += reply[at : at + step]
        calls.push(reply[at : at + step])
        at += step
        pieces.extend(calls.call_deltas())
        if calls.repeated():  # the worker ends the reply at the step that closed a repeat
            break
    ended = at >= len(reply) and cut is None
    _, result = calls.finish(_result(pushed, "stop" if ended or calls.repeated() else "length"))
    joined = _joined(pieces)
    assert sorted(joined) == list(range(len(joined)))
    kept = [(c.name, c.arguments) for c in result.tool_calls]
    # Calls that did not stream (after a repeat the format does not end on: Mistral's) go whole
    # at the end, under the indices after the streamed ones.
    assert [joined[i] for i in range(min(len(kept), len(joined)))] == kept[: len(joined)]
    assert len(joined) - len(kept) <= (0 if result.finish_reason == "tool_calls" else 1)
    if len(joined) > len(kept):  # the cut call is the result's, as it streamed
        cut_call = result.cut_call
        assert cut_call is not None and (cut_call.name, cut_call.arguments) == joined[len(kept)]


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


def test_a_cut_custom_calls_input_is_the_text_it_began() -> None:
    assert custom_input('{"input": "ls -l \\') == "ls -l "
    assert custom_input('{"input": "ls"}') == "ls" and custom_input("ls -l") == "ls -l"


def test_arguments_that_are_not_the_one_field_object_stream_nothing() -> None:
    field = FieldText("input")
    assert field.feed('{"cmd": "ls"}') == "" and field.feed("more") == "" and field.text == ""
