"""The tool-trained Qwen2.5-Coder 1.5B calling a tool on its own, through `openai` and `ollama`.

Slow (a 1.5B model on a small CPU): few requests, short answers. The model chooses the call
itself (tool_choice auto), so this checks the template renders the tools as Qwen expects and
that its answer is parsed into a call, with speculation on (the 0.5B draft).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from daemonproc import Daemon, start_real_daemon
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}
BRIEF_WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris right now?"}
]
MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, qwen_target: Path, qwen_draft: Path, daemon_curves: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("tools-real-home")
    draft = ("--draft", str(qwen_draft), "--method", "draft")
    d = start_real_daemon(home, qwen_target, *draft, curves=daemon_curves)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai(timeout=600) as c:
        yield c


def _city(arguments: str | dict[str, Any]) -> str:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return str(args["city"])


def test_openai_chat_returns_the_call(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather" and "Paris" in _city(call.function.arguments)
    assert "get_weather" not in (choice.message.content or "")


def test_openai_stream_returns_the_call_as_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60, stream=True
    )
    name, arguments, content, finish = "", "", "", None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                name += (call.function and call.function.name) or ""
                arguments += (call.function and call.function.arguments) or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and name == "get_weather" and "Paris" in _city(arguments)
    assert "get_weather" not in content  # the call's text never streamed as content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_ollama_chat_returns_the_call_with_object_arguments(daemon: Daemon, stream: bool) -> None:
    with daemon.ollama(timeout=600) as client:
        kw: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
            "tools": [dict(WEATHER)],
            "options": {"temperature": 0, "num_predict": 60},
        }
        if stream:
            chunks = list(client.chat(stream=True, **kw))
            assert chunks[-1].done
            calls = [c for chunk in chunks for c in chunk.message.tool_calls or []]
        else:
            calls = list(client.chat(stream=False, **kw).message.tool_calls or [])
    (call,) = calls
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, dict) and "Paris" in _city(dict(call.function.arguments))


def test_a_call_the_model_writes_as_bare_json_is_held_to_the_tools_schema(client: openai.OpenAI) -> None:
    # Asked for two cities, Qwen2.5-Coder 1.5B answers with a fenced bare JSON call (no <tool_call>
    # markers) whose city is ["Paris", "Rome"]: parsed as written, the client got arguments its
    # schema refuses. An answer opening as a call is now held to the tool's schema.
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What's the weather in Paris and in Rome?"}],
        tools=[BRIEF_WEATHER],
        temperature=0,
        max_tokens=120,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    for call in choice.message.tool_calls or []:
        assert call.type == "function" and call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str), call.function.arguments


def test_a_forced_call_is_the_same_with_and_without_speculation(client: openai.OpenAI) -> None:
    # The grammar masks the 151,936-token vocabulary at every verified position; the draft's tokens
    # and the grammar's forced ones must leave the greedy answer exactly as the target alone writes it.
    def ask(method: str) -> Any:
        return client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=40,
            extra_body={"speculative": {"method": method}},
        )

    base, spec = ask("none"), ask("draft")
    assert base.choices[0].finish_reason == spec.choices[0].finish_reason == "tool_calls"
    (a,), (b,) = base.choices[0].message.tool_calls, spec.choices[0].message.tool_calls
    assert (a.function.name, a.function.arguments) == (b.function.name, b.function.arguments)
    assert base.usage.completion_tokens == spec.usage.completion_tokens
    assert spec.model_extra["localspec"]["method_steps"].get("grammar", 0) > 0


def test_a_forced_call_unasked_for_parallel_calls_is_one_call(client: openai.OpenAI) -> None:
    # Held to calls with several allowed (OpenAI's default), Qwen2.5-Coder 1.5B wrote get_weather for
    # Paris, then for London, Tokyo... until max_tokens (finish "length", the last call cut). Unless
    # the request asks for parallel calls, a forced call is one, as llama-server makes it.
    out = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=200
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather" and "Paris" in _city(call.function.arguments)


def test_parallel_calls_stream_each_call_as_the_model_writes_it(client: openai.OpenAI) -> None:
    # Held to calls with several allowed, the 1.5B writes call after call: each streams under its
    # own index, and a call that repeats an earlier one (it ends the reply) is never sent.
    two: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the weather in Paris and in London right now?"}
    ]
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": two,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "temperature": 0,
        "max_tokens": 120,
    }
    whole = client.chat.completions.create(**kw).choices[0]
    calls = whole.message.tool_calls or []
    assert len(calls) >= 2, whole
    joined: dict[int, list[str]] = {}
    frames: dict[int, int] = {}  # how many frames carried a piece of each call
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                frames[call.index] = frames.get(call.index, 0) + 1
                got = joined.setdefault(call.index, ["", ""])
                got[0] += (call.function and call.function.name) or ""
                got[1] += (call.function and call.function.arguments) or ""
    assert finish == whole.finish_reason
    assert [tuple(joined[i]) for i in range(len(calls))] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    # The second call too went out as it was written, not whole at the end (a call waits while it
    # is word for word the start of an earlier one: the 1.5B's calls all begin `{"city": "`).
    assert frames[1] >= 2, (frames, calls)
    # Beyond the reply's calls, at most the one cut by max_tokens, whose pieces are a start.
    assert len(joined) - len(calls) <= (1 if finish == "length" else 0)


# A custom tool (input as text, held to a Lark grammar), as Codex's apply_patch is one.
LS_GRAMMAR = 'start: "ls " FLAGS? PATH\nFLAGS: "-" /[la]{1,2}/ " "\nPATH: /[a-z.\\/]{1,16}/\n'
LS_INPUT = r"ls (-[la]{1,2} )?[a-z./]{1,16}"
SHELL = {"name": "shell", "description": "Run a shell command and return what it prints"}
LIST = "List the files in the src folder, in long format."


def test_an_agent_loop_with_a_custom_tool_over_chat_and_responses(client: openai.OpenAI) -> None:
    """The real model writes a custom tool's input as the grammar holds it, in chat's shape and in
    the Responses API's, and goes on from its tool's answer by previous_response_id alone."""
    chat_tool: Any = {
        "type": "custom",
        "custom": {
            **SHELL,
            "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": LS_GRAMMAR}},
        },
    }
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": LIST}],
        tools=[chat_tool],
        tool_choice="required",
        temperature=0,
        max_tokens=40,
    )
    (call,) = out.choices[0].message.tool_calls or []
    assert call.type == "custom" and call.custom.name == "shell"
    assert re.fullmatch(LS_INPUT, call.custom.input) and "src" in call.custom.input, call.custom.input

    flat: Any = {
        **SHELL,
        "type": "custom",
        "format": {"type": "grammar", "syntax": "lark", "definition": LS_GRAMMAR},
    }
    first = client.responses.create(
        model=MODEL, input=LIST, tools=[flat], tool_choice="required", temperature=0, max_output_tokens=40
    )
    (item,) = first.output
    assert item.type == "custom_tool_call" and item.input == call.custom.input  # the same greedy text
    listing = "total 8\n-rw-r--r-- 1 me me 120 Dec  2 app.py\n-rw-r--r-- 1 me me  64 Dec  2 util.py"
    answer: Any = {"type": "custom_tool_call_output", "call_id": item.call_id, "output": listing}
    # tool_choice none: left to choose, the 1.5B calls `ls -l src` again (with a plain function
    # tool too, its prompt checked by /apply-template: the call and its answer are there).
    then = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[answer], tools=[flat], tool_choice="none",
        temperature=0, max_output_tokens=60,
    )  # fmt: skip
    # It read its tool's answer: the files it names are the listing's.
    assert "app.py" in then.output_text, then.output
