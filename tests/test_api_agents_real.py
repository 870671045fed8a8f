"""The tool-trained Qwen2.5-Coder 1.5B calling a tool on its own through `anthropic` and `openai.responses`.

What Claude Code (Messages) and Codex CLI (Responses) do on every turn: offer tools and let
the model choose (tool_choice auto). Slow (a 1.5B model on a small CPU): few requests, short
answers, with speculation on (the 0.5B draft).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolParam
from daemonproc import Daemon, start_real_daemon
from openai.types.responses import FunctionToolParam

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CITY: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city"}},
    "required": ["city"],
}
ASK = "What is the weather in Paris right now?"
DESCRIPTION = "Get the current weather in a city"
RESULT = "sunny, 21C"
MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, qwen_target: Path, qwen_draft: Path, daemon_curves: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("agents-real-home")
    draft = ("--draft", str(qwen_draft), "--method", "draft")
    d = start_real_daemon(home, qwen_target, *draft, curves=daemon_curves)
    yield d
    assert d.stop() == 0, d.log()


def _openai_chat_turn(daemon: Daemon, call_id: str, arguments: dict[str, Any]) -> Any:
    """The same conversation through OpenAI's chat: a call, its result, and the model's next turn."""
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": CITY},
    }
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
    }
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": RESULT},
    ]
    body = {"model": MODEL, "messages": messages, "tools": [tool], "temperature": 0, "max_tokens": 30}
    with daemon.http() as http:
        return http.post("/v1/chat/completions", json=body, timeout=600).json()


def test_claude_code_turn_a_tool_use_then_its_result(daemon: Daemon) -> None:
    tool: ToolParam = {"name": "get_weather", "description": DESCRIPTION, "input_schema": CITY}
    with daemon.anthropic(timeout=600) as client:
        kw: dict[str, Any] = {"model": "claude-sonnet-5-5", "tools": [tool], "extra_body": {"temperature": 0}}
        with client.messages.stream(
            max_tokens=60, messages=[{"role": "user", "content": ASK}], **kw
        ) as stream:
            first = stream.get_final_message()
        assert first.stop_reason == "tool_use", first
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "get_weather" and "Paris" in str(use.input["city"])
        assert all("get_weather" not in b.text for b in first.content if b.type == "text")
        history: list[Any] = [
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]},
        ]
        answer = client.messages.create(max_tokens=30, messages=history, **kw)
    # The result reached the model as chat's `tool` turn does: the same prompt, the same greedy turn.
    chat = _openai_chat_turn(daemon, use.id, use.input)
    prompt = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert prompt == chat["usage"]["prompt_tokens"] > first.usage.input_tokens
    message = chat["choices"][0]["message"]
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert text == (message["content"] or "")
    calls = [(b.name, b.input) for b in answer.content if b.type == "tool_use"]
    assert calls == [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_codex_turn_a_function_call_item(daemon: Daemon, stream: bool) -> None:
    tool: FunctionToolParam = {
        "type": "function",
        "name": "get_weather",
        "description": DESCRIPTION,
        "parameters": CITY,
        "strict": False,
    }
    with daemon.openai(timeout=600) as client:
        kw: dict[str, Any] = {
            "model": MODEL,
            "input": ASK,
            "tools": [tool],
            "temperature": 0,
            "max_output_tokens": 60,
        }
        if stream:
            events = list(client.responses.create(stream=True, **kw))
            assert events[-1].type == "response.completed"
            assert not [
                e for e in events if e.type == "response.output_text.delta"
            ]  # the call never streamed as text
            output = events[-1].response.output
            # The call's arguments streamed as written: joined, the call's arguments.
            (item,) = [o for o in output if o.type == "function_call"]
            pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
            assert pieces and "".join(pieces) == item.arguments
        else:
            output = client.responses.create(**kw).output
    (call,) = [o for o in output if o.type == "function_call"]
    assert call.name == "get_weather" and "Paris" in json.loads(call.arguments)["city"]
