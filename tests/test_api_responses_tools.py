"""Function tools and structured output on OpenAI's Responses API, with the real `openai` package.

The tiny model's template speaks the Hermes syntax; its random weights never choose a call,
so calls here are forced (tool_choice required or a named function), which the grammar
guarantees. The real, tool-trained model choosing a call itself is in test_api_agents_real.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import openai
import pytest
import tinymodels
from daemonproc import Daemon, start_daemon
from openai.types.responses import FunctionToolParam
from openai.types.shared.custom_tool_input_format import Grammar
from test_lark_regex import APPLY_PATCH

pytestmark = pytest.mark.timeout(120)

ASK = "what is the weather in the city"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "maximum": 9}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[FunctionToolParam] = [
    {"type": "function", "name": "get_weather", "description": "Weather", "parameters": CITY, "strict": True},
    {
        "type": "function",
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    },
]
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 160}
# Custom tools: input as text, free or held to a grammar (a Lark one, a regular expression).
SHELL: dict[str, Any] = {"type": "custom", "name": "shell", "description": "Run a command"}
LARK: dict[str, Any] = {"type": "grammar", "syntax": "lark"}
LS = 'start: "ls " FLAG? NAME\nFLAG: "-" ("l" | "a") " "\nNAME: /[a-z]{1,8}/\n'
LS_TEXT = re.compile(r"ls (-[la] )?[a-z]{1,8}")
STAMP = r"[0-9]{4}-[0-9]{2} [A-Z][a-z]{0,6}"
ALLOWED = {"type": "allowed_tools"}
NOPE = {"type": "function", "name": "nope"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Daemon]:
    target = tinymodels.write_tool_target(tiny_dir / "tiny-tools.gguf")
    # 2048: Codex's apply_patch tool alone is ~1,000 tokens of the tiny vocabulary.
    d = start_daemon(tmp_path_factory.mktemp("responses-tools-home"), target, ctx=2048)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai() as c:
        yield c


def test_required_returns_a_function_call_item(client: openai.OpenAI) -> None:
    out = client.responses.create(
        model="tiny-tools",
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    assert out.status == "completed" and out.output_text == ""
    (item,) = out.output
    assert item.type == "function_call" and item.status == "completed"
    assert item.id and item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert item.name in ("get_weather", "get_time") and isinstance(json.loads(item.arguments), dict)
    assert out.tool_choice == "required" and out.parallel_tool_calls is False
    assert [t.name for t in out.tools] == ["get_weather", "get_time"]


def test_allowed_tools_required_calls_the_allowed_tool(client: openai.OpenAI) -> None:
    for name in ("get_time", "get_weather"):
        only = [{"type": "function", "name": name}]
        allowed: Any = {"type": "allowed_tools", "mode": "required", "tools": only}
        kw: dict[str, Any] = {"model": "tiny-tools", "input": ASK, "tools": TOOLS, **GREEDY}
        out = client.responses.create(tool_choice=allowed, **kw)
        assert out.output and {item.type for item in out.output} == {"function_call"}
        assert {item.name for item in out.output if item.type == "function_call"} == {name}
        # The response echoes the choice it was given.
        assert out.tool_choice.type == "allowed_tools"


def test_a_named_call_streams_its_arguments_as_the_model_writes_them(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": "tiny-tools",
        "input": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        **GREEDY,
    }
    (whole,) = client.responses.create(**kw).output
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    # The item opens with the call's name; its arguments come in many deltas, one per step that
    # wrote some of them (the last, where the call's end was read, what is left, if anything).
    assert len(deltas) > 3 and kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(deltas),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done_args, done = events[2], events[-3], events[-2]
    assert (
        added.type == "response.output_item.added"
        and done_args.type == "response.function_call_arguments.done"
    )
    assert done.type == "response.output_item.done"
    assert added.item.type == "function_call" and added.item.status == "in_progress"
    assert added.item.name == "get_weather" and added.output_index == 0
    assert "".join(d.delta for d in deltas) == done_args.arguments == done.item.arguments
    assert done.item.arguments == whole.arguments
    assert {d.item_id for d in deltas} == {done.item.id} == {added.item.id}
    jsonschema_rs.validator_for(CITY).validate(json.loads(done_args.arguments))
    final = events[-1]
    assert final.type == "response.completed" and [o.type for o in final.response.output] == ["function_call"]
    assert final.response.output[0].call_id == done.item.call_id


def test_a_call_cut_by_max_output_tokens_is_an_incomplete_item_holding_what_was_written(
    client: openai.OpenAI,
) -> None:
    kw: dict[str, Any] = {
        "model": "tiny-tools",
        "input": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        **GREEDY,
    }
    whole = client.responses.create(**kw)
    (call,) = whole.output
    assert call.type == "function_call" and whole.usage is not None
    # Cut where the arguments are still being written (the last tokens close them).
    for cut in range(whole.usage.output_tokens - 1, 0, -1):
        events = list(client.responses.create(stream=True, **{**kw, "max_output_tokens": cut}))
        joined = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        if joined != call.arguments:
            break
    assert joined and call.arguments.startswith(joined) and joined != call.arguments
    last = events[-1]
    assert last.type == "response.incomplete"
    (item,) = last.response.output
    assert item.type == "function_call" and item.status == "incomplete" and item.arguments == joined
    assert not [e for e in events if e.type == "response.output_text.delta"]  # no raw call as text
    # Without a stream the same response.
    again = client.responses.create(**{**kw, "max_output_tokens": cut})
    assert again.status == "incomplete" and [
        o.model_dump(exclude={"id", "call_id"}) for o in again.output
    ] == [item.model_dump(exclude={"id", "call_id"})]


def test_a_call_and_its_output_in_the_input_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="tiny-tools",
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    (call,) = first.output
    assert call.type == "function_call"
    history: list[Any] = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"},
    ]
    short = client.responses.create(
        model="tiny-tools", input=ASK, tools=TOOLS, max_output_tokens=1, temperature=0
    )
    out = client.responses.create(
        model="tiny-tools", input=history, tools=TOOLS, max_output_tokens=2, temperature=0
    )
    assert out.usage is not None and short.usage is not None
    assert out.usage.input_tokens > short.usage.input_tokens + 10  # the call and its output were rendered


def test_a_call_answered_by_previous_response_id_reads_as_the_whole_history(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny-tools", "tools": TOOLS, "parallel_tool_calls": False}
    first = client.responses.create(input=ASK, tool_choice="required", **kw, **GREEDY)
    (call,) = first.output
    assert call.type == "function_call"
    answer: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}
    # Only the call's output is sent: the call is the kept response's.
    then = client.responses.create(
        previous_response_id=first.id, input=[answer], max_output_tokens=2, temperature=0, **kw
    )
    whole = client.responses.create(
        input=[{"role": "user", "content": ASK}, call.model_dump(), answer],
        store=False,
        max_output_tokens=2,
        temperature=0,
        **kw,
    )
    assert then.usage is not None and whole.usage is not None
    assert then.usage.input_tokens == whole.usage.input_tokens
    assert then.output_text == whole.output_text


def _chat_tool(tool: FunctionToolParam) -> dict[str, Any]:
    function = {k: v for k, v in tool.items() if k not in ("type", "strict")}
    return {"type": "function", "function": function}


def test_the_history_renders_as_chat_renders_it(client: openai.OpenAI, daemon: Daemon) -> None:
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris", "days": 1}',
    }
    items: list[Any] = [
        {"role": "user", "content": ASK},
        call,
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": "sunny"}],
        },
    ]
    out = client.responses.create(
        model="tiny-tools", input=items, tools=TOOLS, max_output_tokens=1, temperature=0
    )
    chat_body = {
        "model": "tiny-tools",
        "max_tokens": 1,
        "temperature": 0,
        "tools": [_chat_tool(t) for t in TOOLS],
        "messages": [
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }  # fmt: skip
    with daemon.http() as http:
        chat = http.post("/v1/chat/completions", json=chat_body).json()
    assert out.usage is not None and out.usage.input_tokens == chat["usage"]["prompt_tokens"]


def test_text_format_json_schema_and_json_object(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}
    out = client.responses.create(model="tiny-tools", input="yes or no?", text={"format": fmt}, **GREEDY)
    jsonschema_rs.validator_for(ANSWER).validate(json.loads(out.output_text))
    assert out.text.format is not None and out.text.format.type == "json_schema"
    stream = client.responses.create(
        model="tiny-tools", input="hi", text={"format": {"type": "json_object"}}, stream=True, **GREEDY
    )
    text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert text.startswith("{")


@pytest.mark.parametrize(
    ("extra", "words", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "'web_search' tools are not supported", "tools.0"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools.0.name", "tools.0.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "'nope'", "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "web_search_preview"}},
            "tool_choice must be",
            "tool_choice",
        ),
        (
            {"tools": TOOLS, "tool_choice": {**ALLOWED, "mode": "auto", "tools": [{"type": "mcp"}]}},
            "tool_choice.tools.0",
            "tool_choice.tools.0.type",
        ),
        (
            {"tools": TOOLS, "tool_choice": {**ALLOWED, "mode": "required", "tools": [NOPE]}},
            "'nope'",
            "tool_choice",
        ),
        ({"text": {"format": {"type": "xml"}}}, "text.format", "text.format"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}},
            "",
            "text.format",
        ),
        (
            {"input": [{"type": "web_search_call", "id": "ws_1", "status": "completed"}]},
            "'web_search_call' items are not supported",
            "input.0",
        ),
        (
            {"tools": [{**SHELL, "format": {**LARK, "definition": 'start: "(" start ")" | "x"'}}]},
            "recursive (start -> start)",
            "tools.0.format.definition",
        ),
        (
            {"tools": [{**SHELL, "format": {**LARK, "definition": 'start: "a"\n%ignore " "'}}]},
            "%ignore",
            "tools.0.format.definition",
        ),
        (
            {"tools": [{**SHELL, "format": {"type": "grammar", "syntax": "regex", "definition": "(a"}}]},
            "tools.0.format.definition: ",
            "tools.0.format.definition",
        ),
        ({"tools": [{**SHELL, "format": {"type": "grammar"}}]}, "syntax and definition", "tools.0.format"),
        ({"tools": [SHELL], "tool_choice": {"type": "custom", "name": "nope"}}, "'nope'", "tool_choice"),
    ],
)
def test_tool_errors_are_clear_400s(daemon: Daemon, extra: dict[str, Any], words: str, param: str) -> None:
    body = {"model": "tiny-tools", "input": "hi", "max_output_tokens": 4, **extra}
    with daemon.http() as http:
        response = http.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["param"] == param


def test_the_sdks_stream_helper_accumulates_the_call(client: openai.OpenAI) -> None:
    choice: Any = {"type": "function", "name": "get_weather"}
    with client.responses.stream(
        model="tiny-tools", input=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, **GREEDY
    ) as stream:
        arguments = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == arguments
    jsonschema_rs.validator_for(CITY).validate(json.loads(arguments))


def test_a_custom_tools_input_is_held_to_its_lark_grammar_and_comes_back_as_text(
    client: openai.OpenAI,
) -> None:
    tool: Any = {**SHELL, "format": {**LARK, "definition": LS}}
    choice: Any = {"type": "custom", "name": "shell"}
    kw: dict[str, Any] = {"model": "tiny-tools", "input": "list", "tools": [tool], **GREEDY}
    out = client.responses.create(tool_choice=choice, **kw)
    (item,) = out.output
    assert item.type == "custom_tool_call" and item.name == "shell" and item.call_id.startswith("call_")
    # The text itself, not the JSON call the model wrote it in: what the grammar describes.
    assert LS_TEXT.fullmatch(item.input), item.input
    assert out.tools[0].type == "custom" and out.tool_choice.type == "custom"
    # required and allowed_tools hold it the same way; the same greedy call each time.
    assert client.responses.create(tool_choice="required", **kw).output[0].input == item.input
    only: Any = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "custom", "name": "shell"}]}
    assert client.responses.create(tool_choice=only, **kw).output[0].input == item.input


def test_a_regex_custom_tool_and_free_text_one(client: openai.OpenAI) -> None:
    stamp: Any = {
        **SHELL,
        "name": "stamp",
        "format": {"type": "grammar", "syntax": "regex", "definition": STAMP},
    }
    free: Any = {**SHELL, "name": "note"}  # no format: unconstrained text
    choice: Any = {"type": "custom", "name": "stamp"}
    out = client.responses.create(
        model="tiny-tools", input="go", tools=[stamp, free], tool_choice=choice, **GREEDY
    )
    (item,) = out.output
    assert item.type == "custom_tool_call" and item.name == "stamp" and re.fullmatch(STAMP, item.input)
    # Free text has no end a grammar could force: the random model's string runs to max_output_tokens,
    # the call cut, so the response is incomplete (a real model closes its string itself).
    named: Any = {"type": "custom", "name": "note"}
    cut = client.responses.create(
        model="tiny-tools", input="go", tools=[stamp, free], tool_choice=named, **GREEDY
    )
    assert cut.status == "incomplete" and [t.type for t in cut.tools] == ["custom", "custom"]
    # The call cut short is an incomplete item holding the start of its input, as text.
    (started,) = cut.output
    assert started.type == "custom_tool_call" and started.status == "incomplete" and started.name == "note"
    assert started.input and not started.input.startswith('{"input"')


def test_a_custom_calls_input_streams_as_text_as_the_model_writes_it(client: openai.OpenAI) -> None:
    tool: Any = {**SHELL, "format": {**LARK, "definition": LS}}
    kw: dict[str, Any] = {
        "model": "tiny-tools",
        "input": "list",
        "tools": [tool],
        "tool_choice": "required",
        **GREEDY,
    }
    (whole,) = client.responses.create(**kw).output
    events = list(client.responses.create(stream=True, **kw))
    deltas = [e for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 1 and [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.custom_tool_call_input.delta"] * len(deltas),
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done_input, done = events[2], events[-3], events[-2]
    assert added.type == "response.output_item.added" and added.item.type == "custom_tool_call"
    assert added.item.input == ""
    assert (
        done_input.type == "response.custom_tool_call_input.done" and done.type == "response.output_item.done"
    )
    # The text itself, piece by piece, never the JSON the model wrote it in.
    assert "".join(d.delta for d in deltas) == done_input.input == whole.input
    assert all("{" not in d.delta and '"' not in d.delta for d in deltas)
    assert {d.item_id for d in deltas} == {done.item.id} == {added.item.id}
    assert done.item.id.startswith("ctc_")


def test_a_custom_call_and_its_output_render_as_the_same_call_in_chat(
    client: openai.OpenAI, daemon: Daemon
) -> None:
    tool: Any = {**SHELL, "format": {**LARK, "definition": LS}}
    items: list[Any] = [
        {"role": "user", "content": "list"},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "shell", "input": "ls -l src"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "a.py\nb.py"},
    ]
    out = client.responses.create(
        model="tiny-tools", input=items, tools=[tool], max_output_tokens=1, temperature=0
    )
    # Chat's view of the same: a function of one string, called with {"input": ...}.
    (spec,) = [t for t in out.tools if t.type == "custom"]
    assert spec.name == "shell"
    chat_body = {
        "model": "tiny-tools",
        "max_tokens": 1,
        "temperature": 0,
        "tools": [{"type": "function", "function": {
            "name": "shell",
            "description": "Run a command\n\nThe input is text that a Lark grammar holds:\n" + LS,
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                           "required": ["input"], "additionalProperties": False},
        }}],
        "messages": [
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "shell", "arguments": json.dumps({"input": "ls -l src"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
        ],
    }  # fmt: skip
    with daemon.http() as http:
        chat = http.post("/v1/chat/completions", json=chat_body).json()
    assert out.usage is not None and out.usage.input_tokens == chat["usage"]["prompt_tokens"]


def test_codexs_apply_patch_tool_is_taken_as_codex_sends_it(client: openai.OpenAI) -> None:
    # codex-rs's freeform apply_patch tool: its shape and grammar as it sends them.
    tool: Any = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
        "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH},
    }
    out = client.responses.create(
        model="tiny-tools", input="edit", tools=[tool], max_output_tokens=2, temperature=0
    )
    assert out.status == "incomplete" and out.tools[0].type == "custom" and out.tools[0].name == "apply_patch"
    assert isinstance(out.tools[0].format, Grammar) and out.tools[0].format.definition == APPLY_PATCH
