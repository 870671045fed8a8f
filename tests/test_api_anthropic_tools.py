"""Tool use on Anthropic's Messages API, with the real `anthropic` package against a real daemon.

The tiny model's template speaks the Hermes syntax; its random weights never choose a call,
so calls here are forced (tool_choice any or tool), which the grammar guarantees. The real,
tool-trained model choosing a call itself is in test_api_agents_real.py (slow).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema_rs
import pytest
import tinymodels
from anthropic.types import MessageParam, ToolParam
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)

ASK: list[MessageParam] = [{"role": "user", "content": "what is the weather in the city"}]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "maximum": 9}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[ToolParam] = [
    {"name": "get_weather", "description": "Weather", "input_schema": CITY},
    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Daemon]:
    target = tinymodels.write_tool_target(tiny_dir / "tiny-tools.gguf")
    d = start_daemon(tmp_path_factory.mktemp("anthropic-tools-home"), target, ctx=1024)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[anthropic.Anthropic]:
    with daemon.anthropic() as c:
        yield c


def _create(client: anthropic.Anthropic, **kw: Any) -> Any:
    return client.messages.create(
        model="claude-sonnet-5-5", max_tokens=160, messages=ASK, tools=TOOLS, extra_body=GREEDY, **kw
    )


def test_tool_choice_any_returns_a_parsed_tool_use_block(client: anthropic.Anthropic) -> None:
    out = _create(client, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert out.stop_reason == "tool_use" and out.stop_sequence is None
    (block,) = out.content
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert block.name in ("get_weather", "get_time") and isinstance(block.input, dict)


def test_a_named_tool_streams_and_the_sdk_accumulates_its_input(client: anthropic.Anthropic) -> None:
    choice: Any = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    whole = _create(client, tool_choice=choice)
    with client.messages.stream(
        model="claude-sonnet-5-5",
        max_tokens=160,
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        extra_body=GREEDY,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert isinstance(block.input, dict) and block.input == whole.content[0].input
    jsonschema_rs.validator_for(CITY).validate(block.input)
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == whole.usage.output_tokens
    kinds = [e.type for e in events if e.type not in ("input_json", "text")]  # the SDK's own helper events
    # The input streams as the model writes it: a delta per step that wrote some of it.
    deltas = kinds.count("content_block_delta")
    assert deltas > 3 and kinds == ["message_start", "content_block_start",
                                    *["content_block_delta"] * deltas, "content_block_stop",
                                    "message_delta", "message_stop"]  # fmt: skip
    joined = "".join(e.partial_json for e in events if e.type == "input_json")
    assert json.loads(joined) == whole.content[0].input


def test_stream_frames_match_anthropics_shapes(daemon: Daemon) -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 160,
        "temperature": 0,
        "messages": ASK,
        "tools": TOOLS,
        "stream": True,
        "tool_choice": {"type": "tool", "name": "get_time"},
    }
    with daemon.http() as http, http.stream("POST", "/v1/messages", json=body) as response:
        datas = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    start = next(d for d in datas if d["type"] == "content_block_start")
    assert start["index"] == 0 and start["content_block"]["type"] == "tool_use"
    assert start["content_block"]["input"] == {} and start["content_block"]["name"] == "get_time"
    deltas = [d["delta"] for d in datas if d["type"] == "content_block_delta"]
    assert deltas and all(d["type"] == "input_json_delta" for d in deltas)
    assert isinstance(json.loads("".join(d["partial_json"] for d in deltas)), dict)
    assert datas[-2]["delta"]["stop_reason"] == "tool_use" and datas[-1]["type"] == "message_stop"


def test_a_tool_use_cut_by_max_tokens_closes_with_what_was_written(
    client: anthropic.Anthropic, daemon: Daemon
) -> None:
    choice: Any = {"type": "tool", "name": "get_weather"}
    whole = _create(client, tool_choice=choice)
    arguments = json.dumps(whole.content[0].input, ensure_ascii=False)
    body = {"model": "claude-x", "temperature": 0, "messages": ASK, "tools": TOOLS, "stream": True}
    # Cut where the input is still being written (the last tokens close it).
    for cut in range(whole.usage.output_tokens - 1, 0, -1):
        with (
            daemon.http() as http,
            http.stream("POST", "/v1/messages", json={**body, "max_tokens": cut, "tool_choice": choice}) as r,
        ):
            datas = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        joined = "".join(d["delta"]["partial_json"] for d in datas if d["type"] == "content_block_delta")
        if joined != arguments:
            break
    assert joined and arguments.startswith(joined)
    kinds = [d["type"] for d in datas]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens" and datas[-1]["type"] == "message_stop"
    # Without a stream: a tool_use's input is an object, so the call cut short is left out, and
    # its raw text is not shown as text either.
    with daemon.http() as http:
        unstreamed = {**body, "stream": False, "max_tokens": cut, "tool_choice": choice}
        whole_cut = http.post("/v1/messages", json=unstreamed).json()
    assert whole_cut["stop_reason"] == "max_tokens" and whole_cut["content"] == [{"type": "text", "text": ""}]


def test_a_tool_use_and_its_result_in_the_history_round_trip(client: anthropic.Anthropic) -> None:
    first = _create(client, tool_choice={"type": "tool", "name": "get_weather"})
    # The answer sent back as Claude Code does: the assistant's blocks as they came, then the results.
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": b.id,
                    "content": [{"type": "text", "text": "sunny, 21C"}],
                }
                for b in first.content
                if b.type == "tool_use"
            ]
            + [{"type": "text", "text": "and tomorrow?"}],
        },
    ]
    alone = client.messages.count_tokens(model="claude-x", messages=ASK, tools=TOOLS)
    counted = client.messages.count_tokens(model="claude-x", messages=history, tools=TOOLS)
    out = client.messages.create(
        model="claude-x", max_tokens=2, messages=history, tools=TOOLS, extra_body=GREEDY
    )
    # The call and its answer were rendered into the prompt: it grew, and count_tokens agrees.
    assert (
        out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)
        == counted.input_tokens
        > alone.input_tokens
    )
    assert out.stop_reason in ("max_tokens", "end_turn", "tool_use")


def test_count_tokens_counts_the_tools(client: anthropic.Anthropic) -> None:
    bare = client.messages.count_tokens(model="claude-x", messages=ASK)
    with_tools = client.messages.count_tokens(model="claude-x", messages=ASK, tools=TOOLS)
    made = client.messages.create(
        model="claude-x", max_tokens=1, messages=ASK, tools=TOOLS, extra_body=GREEDY
    )
    assert with_tools.input_tokens == made.usage.input_tokens + (made.usage.cache_read_input_tokens or 0)
    assert with_tools.input_tokens > bare.input_tokens + 20


def test_claude_code_fields_are_accepted(daemon: Daemon) -> None:
    # What Claude Code sends besides tools: system blocks with cache_control, metadata, thinking,
    # and thinking blocks of earlier turns (which this model never writes) in the history.
    body = {
        "model": "claude-sonnet-5-5",
        "max_tokens": 3,
        "temperature": 0,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "user_abc"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [{**TOOLS[1], "cache_control": {"type": "ephemeral"}}],
        "messages": [
            *ASK,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "ok"},
                ],
            },
            {"role": "user", "content": "go on"},
        ],
    }
    with daemon.http() as http:
        response = http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    assert all(b["type"] != "thinking" for b in response.json()["content"])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "'web_search_20250305' tools"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "'nope'"),
        ({"tool_choice": {"type": "tool"}}, "needs a name"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ]
            },
            "vision",
        ),
    ],
)
def test_tool_errors_are_clear_anthropic_400s(daemon: Daemon, extra: dict[str, Any], words: str) -> None:
    body = {"model": "claude-x", "max_tokens": 4, "messages": ASK, "tools": TOOLS, **extra}
    with daemon.http() as http:
        response = http.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"]


def test_structured_outputs_hold_the_reply_to_the_schema(client: anthropic.Anthropic, daemon: Daemon) -> None:
    """Anthropic's structured outputs, as the SDK sends them (output_config.format), and the beta's
    output_format; sampled (temperature 1, Anthropic's default), so the grammar holds the reply."""
    fmt: Any = {"type": "json_schema", "schema": CITY}
    for _ in range(2):
        out = client.messages.create(
            model="claude-sonnet-5-5",
            max_tokens=80,
            messages=ASK,
            output_config={"format": fmt},
        )
        block = out.content[0]
        assert out.stop_reason == "end_turn" and block.type == "text"
        jsonschema_rs.validator_for(CITY).validate(json.loads(block.text))
    body = {"model": "claude-x", "max_tokens": 80, "messages": ASK, "output_format": fmt}
    with daemon.http() as http:
        beta = http.post("/v1/messages", json=body).json()
        jsonschema_rs.validator_for(CITY).validate(json.loads(beta["content"][0]["text"]))
        bad = http.post(
            "/v1/messages",
            json={**body, "output_format": {"type": "json_schema", "schema": {"type": "strin"}}},
        )
    assert bad.status_code == 400 and "output_format" in bad.json()["error"]["message"]
