"""Tool calling and structured output over the API, with the real `openai` and `ollama` packages.

The daemon serves a tiny model whose template speaks the Hermes syntax; its random weights
never choose to call a tool, so calls here are forced (tool_choice required or named), which
is what the grammar guarantees. The real, tool-trained model choosing a call on its own is in
test_api_tools_real.py (slow).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import ollama
import openai
import pytest
import tinymodels
from daemonproc import Daemon, start_daemon
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from test_api_responses_tools import LS, LS_TEXT, STAMP

pytestmark = pytest.mark.timeout(120)

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "what is the weather in the city"}]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "maximum": 9}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}},
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
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
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 160}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Daemon]:
    target = tinymodels.write_tool_target(tiny_dir / "tiny-tools.gguf")
    d = start_daemon(tmp_path_factory.mktemp("tools-home"), target, ctx=1024)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai() as c:
        yield c


@pytest.fixture
def ollama_client(daemon: Daemon) -> Iterator[ollama.Client]:
    with daemon.ollama() as c:
        yield c


def test_a_required_call_comes_back_parsed(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny-tools",
        messages=CHAT,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    json.loads(call.function.arguments)


def test_a_named_call_streams_as_tool_call_deltas(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    kw: dict[str, Any] = {
        "model": "tiny-tools",
        "messages": CHAT,
        "tools": TOOLS,
        "tool_choice": named,
        "parallel_tool_calls": False,
        **GREEDY,
    }
    whole = client.chat.completions.create(**kw).choices[0]
    content, name, arguments, finish = "", "", "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.index == 0
            name += (call.function and call.function.name) or ""
            arguments += (call.function and call.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == ""
    (call,) = whole.message.tool_calls or []
    assert name == call.function.name == "get_weather"
    assert arguments == call.function.arguments
    jsonschema_rs.validator_for(CITY).validate(json.loads(arguments))


def test_allowed_tools_hold_the_calls_to_the_tools_they_name(client: openai.OpenAI) -> None:
    # OpenAI's allowed_tools: every tool stays in the prompt, calls name only the allowed ones.
    kw: dict[str, Any] = {"model": "tiny-tools", "messages": CHAT, "tools": TOOLS, **GREEDY}
    for name in ("get_time", "get_weather"):
        only = [{"type": "function", "function": {"name": name}}]
        allowed: Any = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": only}}
        out = client.chat.completions.create(tool_choice=allowed, **kw)
        calls = out.choices[0].message.tool_calls or []
        assert out.choices[0].finish_reason == "tool_calls" and calls
        assert {c.function.name for c in calls} == {name}
        # The prompt is the one every tool is offered in, whichever are allowed.
        assert out.usage is not None
        offered = client.chat.completions.create(**{**kw, "max_tokens": 1}).usage
        assert offered is not None and out.usage.prompt_tokens == offered.prompt_tokens
    # In auto mode the tiny model's random weights call nothing: a plain reply.
    auto: Any = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(tool_choice=auto, **kw)
    assert err.value.param == "tool_choice" and "allows no tools" in str(err.value)
    auto["allowed_tools"]["tools"] = [{"type": "function", "function": {"name": "get_time"}}]
    reply = client.chat.completions.create(tool_choice=auto, **kw).choices[0]
    assert reply.finish_reason in ("stop", "length") and not reply.message.tool_calls


def test_a_call_in_the_history_and_its_answer_are_accepted(client: openai.OpenAI) -> None:
    history: list[ChatCompletionMessageParam] = [
        *CHAT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    out = client.chat.completions.create(model="tiny-tools", messages=history, tools=TOOLS, max_tokens=4)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert out.usage is not None and out.usage.prompt_tokens > 100  # the tools and the call were rendered


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for temperature in (0.0, 1.0):
        out = client.chat.completions.create(
            model="tiny-tools",
            messages=CHAT,
            response_format=fmt,
            temperature=temperature,
            max_tokens=80,
            seed=1,
        )
        assert out.choices[0].finish_reason == "stop"
        jsonschema_rs.validator_for(ANSWER).validate(json.loads(out.choices[0].message.content or ""))


def test_response_format_json_object_streams(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-tools", messages=CHAT, response_format={"type": "json_object"}, stream=True, **GREEDY
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("{")
    if len(text) < 400:  # not cut off by max_tokens
        assert isinstance(json.loads(text), dict)


def test_errors_name_their_param(client: openai.OpenAI) -> None:
    bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-tools", messages=CHAT, response_format=bad, max_tokens=4)
    assert err.value.param == "response_format"
    missing: Any = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-tools", messages=CHAT, tools=TOOLS, tool_choice=missing)
    assert err.value.param == "tool_choice" and "nope" in str(err.value)
    not_offered: Any = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]},
    }
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-tools", messages=CHAT, tools=TOOLS, tool_choice=not_offered, max_tokens=4
        )
    assert err.value.param == "tool_choice" and "nope" in str(err.value)


def test_ollama_format_schema_and_json(ollama_client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "yes or no?"}]
    out = ollama_client.chat(
        model="tiny-tools", messages=messages, format=ANSWER, options={"num_predict": 80}
    )
    jsonschema_rs.validator_for(ANSWER).validate(json.loads(out.message.content or ""))
    gen = ollama_client.generate(
        model="tiny-tools", prompt="hello", format="json", options={"num_predict": 200}
    )
    text = gen.response or ""
    if gen.done_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


def test_ollama_rejects_a_bad_format(ollama_client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client.chat(
            model="tiny-tools", messages=[{"role": "user", "content": "x"}], format={"type": "strin"}
        )
    assert err.value.status_code == 400 and "format" in err.value.error


def test_ollama_show_lists_tools_for_a_template_that_takes_them(ollama_client: ollama.Client) -> None:
    assert "tools" in (ollama_client.show("tiny-tools").capabilities or [])


# --- the other ways clients ask for a form: llama-server's and vLLM's fields ------------------------

CODE = r"[A-Z]{2}-[0-9]{3}"
YES_NO_GBNF = 'root ::= answer\nanswer ::= "yes" | "no"'


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"grammar": YES_NO_GBNF}, lambda t: t in ("yes", "no")),  # llama-server
        ({"json_schema": ANSWER}, lambda t: _valid(ANSWER, t)),  # llama-server
        ({"response_format": {"type": "json_object", "schema": ANSWER}}, lambda t: _valid(ANSWER, t)),
        ({"guided_json": ANSWER}, lambda t: _valid(ANSWER, t)),  # vLLM
        ({"guided_json": json.dumps(ANSWER)}, lambda t: _valid(ANSWER, t)),
        ({"guided_regex": CODE}, lambda t: re.fullmatch(CODE, t)),
        ({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
        ({"guided_grammar": YES_NO_GBNF}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
        ({"structured_outputs": {"regex": CODE}}, lambda t: re.fullmatch(CODE, t)),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_llama_server_and_vllm_constraints_hold_the_chat_reply(
    client: openai.OpenAI, extra: dict[str, Any], check: Callable[[str], object]
) -> None:
    """Sent as clients send them through the openai package (extra_body, or a response_format the
    SDK passes on as it is); sampled, so it is the grammar that holds the reply, not a lucky path."""
    for seed in (1, 2):
        out = client.chat.completions.create(
            model="tiny-tools", messages=CHAT, temperature=1.0, seed=seed, max_tokens=80, extra_body=extra
        )
        text = out.choices[0].message.content or ""
        assert out.choices[0].finish_reason == "stop" and check(text), (extra, text)


def test_constraints_hold_completions_too(client: openai.OpenAI, daemon: Daemon) -> None:
    out = client.completions.create(
        model="tiny-tools",
        prompt="the code is",
        max_tokens=20,
        temperature=1.0,
        extra_body={"guided_regex": CODE},
    )
    assert re.fullmatch(CODE, out.choices[0].text)
    # llama-server's /completion, as its README shows the two fields.
    with daemon.http() as http:
        body = {"prompt": "answer:", "n_predict": 20, "grammar": YES_NO_GBNF}
        assert http.post("/completion", json=body).json()["content"] in ("yes", "no")
        body = {"prompt": "answer:", "n_predict": 80, "json_schema": ANSWER}
        _valid(ANSWER, http.post("/completion", json=body).json()["content"])
        anything = http.post("/completion", json={"prompt": "x", "n_predict": 200, "json_schema": {}}).json()
        assert anything["content"].startswith("{")  # {}: any object, as llama-server reads it


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"grammar": YES_NO_GBNF, "guided_regex": CODE}, "guided_regex", "both hold the reply"),
        ({"json_schema": ANSWER, "response_format": {"type": "json_object"}}, "json_schema", "both hold"),
        ({"grammar": 'root ::= "a" missing'}, "grammar", "Rule 'missing' not found"),
        ({"guided_regex": "[a-"}, "guided_regex", "unclosed character class"),
        ({"guided_choice": []}, "guided_choice", "one or more choices"),
        ({"guided_json": "{not json"}, "guided_json", "not a JSON schema"),
        ({"grammar": YES_NO_GBNF, "tools": TOOLS}, "grammar", "without tools"),
    ],
)
def test_a_constraint_that_cannot_hold_is_a_400_naming_it(
    client: openai.OpenAI, extra: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-tools", messages=CHAT, max_tokens=4, extra_body=extra)
    assert err.value.param == param and says in str(err.value)
    # And the daemon serves on.
    out = client.chat.completions.create(model="tiny-tools", messages=CHAT, max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")


def _valid(schema: dict[str, Any], text: str) -> bool:
    jsonschema_rs.validator_for(schema).validate(json.loads(text))
    return True


# --- custom tools: input as text (`{"type": "custom", "custom": {...}}`, chat's shape) --------

SHELL_CUSTOM: dict[str, Any] = {"name": "shell", "description": "Run a command"}


def _custom(grammar: str | None = None, syntax: str = "lark", **fields: Any) -> Any:
    fmt = {"type": "grammar", "grammar": {"syntax": syntax, "definition": grammar}} if grammar else None
    return {"type": "custom", "custom": {**SHELL_CUSTOM, **fields, **({"format": fmt} if fmt else {})}}


def test_a_custom_tools_input_is_held_to_its_grammar_and_comes_back_as_text(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny-tools", "messages": CHAT, "tools": [_custom(LS)], **GREEDY}
    named: Any = {"type": "custom", "custom": {"name": "shell"}}
    out = client.chat.completions.create(tool_choice=named, **kw)
    assert out.choices[0].finish_reason == "tool_calls"
    (call,) = out.choices[0].message.tool_calls or []
    assert call.type == "custom" and call.id.startswith("call_") and call.custom.name == "shell"
    # The text itself, not the JSON call the model wrote it in.
    assert LS_TEXT.fullmatch(call.custom.input), call.custom.input
    # required and allowed_tools (a custom entry) hold it the same way: the same greedy call.
    required = client.chat.completions.create(tool_choice="required", **kw).choices[0].message.tool_calls
    assert required and required[0].type == "custom" and required[0].custom.input == call.custom.input
    only = [{"type": "custom", "custom": {"name": "shell"}}]
    allowed: Any = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": only}}
    held = client.chat.completions.create(tool_choice=allowed, **kw).choices[0].message.tool_calls
    assert held and held[0].type == "custom" and held[0].custom.input == call.custom.input


def test_custom_and_function_tools_side_by_side(client: openai.OpenAI) -> None:
    stamp = _custom(STAMP, "regex", name="stamp")
    tools: Any = [*TOOLS, stamp]
    kw: dict[str, Any] = {"model": "tiny-tools", "messages": CHAT, "tools": tools, **GREEDY}
    custom = client.chat.completions.create(tool_choice={"type": "custom", "custom": {"name": "stamp"}}, **kw)
    (call,) = custom.choices[0].message.tool_calls or []
    assert call.type == "custom" and re.fullmatch(STAMP, call.custom.input), call
    # A function beside it still comes back as a function, arguments as JSON text.
    function = client.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kw
    )
    (fcall,) = function.choices[0].message.tool_calls or []
    assert fcall.type == "function" and fcall.function.name == "get_weather"
    jsonschema_rs.validator_for(CITY).validate(json.loads(fcall.function.arguments))


def test_a_custom_call_streams_as_a_custom_tool_call_delta(client: openai.OpenAI, daemon: Daemon) -> None:
    body: dict[str, Any] = {
        "model": "tiny-tools",
        "messages": CHAT,
        "tools": [_custom(LS)],
        "tool_choice": "required",
        **GREEDY,
    }
    (whole,) = client.chat.completions.create(**body).choices[0].message.tool_calls or []
    assert whole.type == "custom"
    # The bytes, as OpenAI streams one (its SDK's delta type has no `custom` field yet).
    with daemon.http() as http:
        text = http.post("/v1/chat/completions", json={**body, "stream": True}).text
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [call for d in deltas for call in d.get("tool_calls", ())]
    assert calls == [{"index": 0, "id": calls[0]["id"], "type": "custom", "custom": whole.custom.to_dict()}]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_custom_call_in_the_history_renders_as_the_responses_api_renders_it(
    client: openai.OpenAI,
) -> None:
    history: list[Any] = [
        *CHAT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "custom", "custom": {"name": "shell", "input": "ls -l src"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    ]
    chat = client.chat.completions.create(
        model="tiny-tools", messages=history, tools=[_custom(LS)], max_tokens=1, temperature=0
    )
    items: list[Any] = [
        {"role": "user", "content": CHAT[0]["content"]},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "shell", "input": "ls -l src"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "a.py\nb.py"},
    ]
    flat: Any = {
        **SHELL_CUSTOM,
        "type": "custom",
        "format": {"type": "grammar", "syntax": "lark", "definition": LS},
    }
    responses = client.responses.create(
        model="tiny-tools", input=items, tools=[flat], max_output_tokens=1, temperature=0
    )
    # The same tool, the same call and its answer: the same prompt, token for token.
    assert chat.usage is not None and responses.usage is not None
    assert chat.usage.prompt_tokens == responses.usage.input_tokens
    # And the call went in: without it the prompt is shorter.
    alone = client.chat.completions.create(
        model="tiny-tools", messages=CHAT, tools=[_custom(LS)], max_tokens=1, temperature=0
    )
    assert alone.usage is not None and alone.usage.prompt_tokens < chat.usage.prompt_tokens


HELD = "tools.0.custom.format.grammar.definition"
NAMES_NOPE = {"tool_choice": {"type": "custom", "custom": {"name": "nope"}}}
UNNAMED_ALLOWED = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "custom"}]}}
NO_GRAMMAR = {"type": "custom", "custom": {**SHELL_CUSTOM, "format": {"type": "grammar"}}}


@pytest.mark.parametrize(
    ("tools", "extra", "words", "param"),
    [
        ([_custom('start: "(" start ")" | "x"')], {}, "recursive (start -> start)", HELD),
        ([_custom("(a", "regex")], {}, f"{HELD}: ", HELD),
        ([{"type": "custom"}], {}, "needs `custom`", "tools.0.custom"),
        ([NO_GRAMMAR], {}, "syntax and definition", "tools.0.custom.format"),
        (
            [_custom(LS)],
            {"tool_choice": {"type": "custom", "custom": {"name": "nope"}}},
            "nope",
            "tool_choice",
        ),
        (
            [_custom(LS)],
            {"tool_choice": UNNAMED_ALLOWED},
            "needs `custom`",
            "tool_choice.allowed_tools.tools.0",
        ),
    ],
)
def test_custom_tool_errors_are_400s_naming_the_field(
    daemon: Daemon, tools: list[Any], extra: dict[str, Any], words: str, param: str
) -> None:
    body = {"model": "tiny-tools", "messages": CHAT, "max_tokens": 4, "tools": tools, **extra}
    with daemon.http() as http:
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert words in error["message"] and error["param"] == param, error
        # And the daemon serves on.
        assert (
            http.post(
                "/v1/chat/completions", json={**body, "tools": TOOLS, "tool_choice": "auto"}
            ).status_code
            == 200
        )


# --- a call's arguments stream as written -----------------------------------------------------


# A forced call to get_weather: its grammar holds it, so its arguments stream.
NAMED_WEATHER: dict[str, Any] = {
    "model": "tiny-tools",
    "messages": CHAT,
    "tools": TOOLS,
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    **GREEDY,
}


def _stream_frames(daemon: Daemon, body: dict[str, Any]) -> list[dict[str, Any]]:
    with daemon.http() as http:
        text = http.post("/v1/chat/completions", json={**body, "stream": True}).text
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_a_calls_arguments_stream_piece_by_piece_as_the_model_writes_them(
    client: openai.OpenAI, daemon: Daemon
) -> None:
    body = NAMED_WEATHER
    (whole,) = client.chat.completions.create(**body).choices[0].message.tool_calls or []
    frames = _stream_frames(daemon, body)
    pieces = [
        (frame.get("localspec"), call)
        for frame in frames
        for choice in frame["choices"]
        for call in choice["delta"].get("tool_calls", ())
    ]
    # Many pieces, each in the step whose tokens wrote it (the last frame's is the rest, if any).
    assert len(pieces) > 3 and all(extra is not None for extra, _ in pieces[:-1])
    first = pieces[0][1]
    assert first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == "get_weather"
    assert all("id" not in call and "name" not in call["function"] for _, call in pieces[1:])
    joined = "".join(call["function"]["arguments"] for _, call in pieces)
    assert joined == whole.function.arguments
    assert frames[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # The openai package's stream helper joins them into the same call.
    with client.chat.completions.stream(**body) as stream:
        final = stream.get_final_completion()
    (helped,) = final.choices[0].message.tool_calls or []
    assert helped.function.name == "get_weather" and helped.function.arguments == whole.function.arguments


def test_a_call_cut_by_max_tokens_streams_what_was_written_and_no_raw_text(
    client: openai.OpenAI, daemon: Daemon
) -> None:
    body = NAMED_WEATHER
    whole = client.chat.completions.create(**body)
    (call,) = whole.choices[0].message.tool_calls or []
    assert whole.usage is not None
    # Cut where the call's arguments are still being written (the last of its tokens close it).
    for cut in range(whole.usage.completion_tokens - 1, 0, -1):
        frames = _stream_frames(daemon, {**body, "max_tokens": cut})
        deltas = [choice["delta"] for frame in frames for choice in frame["choices"]]
        joined = "".join(c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", ()))
        if joined != call.function.arguments:
            break
    assert frames[-1]["choices"][0]["finish_reason"] == "length"
    # What a client holds is the start of the arguments, as OpenAI's stream leaves a cut call;
    # the call's raw text is never content.
    assert joined.startswith('{"city": "') and call.function.arguments.startswith(joined)
    assert joined != call.function.arguments and "".join(d.get("content") or "" for d in deltas) == ""
    # Without a stream the same: the call cut short, its arguments the start written, no content.
    cut_whole = client.chat.completions.create(**{**body, "max_tokens": cut}).choices[0]
    (partial,) = cut_whole.message.tool_calls or []
    assert cut_whole.finish_reason == "length" and cut_whole.message.content is None
    assert partial.type == "function" and partial.function.name == "get_weather"
    assert partial.function.arguments == joined
