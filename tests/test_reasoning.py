"""A thinking model's reasoning apart from its answer: the split, the engine, and every API's clients.

The tiny thinking model (tinymodels.write_thinking_target) writes
"<think> hello world</think> python function" after its template's prompt, so each route's
reasoning and answer are known: reasoning "hello world", answer "python function".
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest
import tinymodels
from daemonproc import Daemon, start_daemon
from test_tui_app import type_and_send, wait_until

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.constraint import gbnf_lark
from localspec.engine.reasoning import ReasoningSplit, StreamSplit, opens_inside, thinks
from localspec.engine.worker import Engine
from localspec.settings import load_settings
from localspec.types import (
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    Method,
    SpecParams,
    TokenChunk,
    ToolChoice,
    ToolSpec,
)
from tui.app import make_app
from tui.chats import ChatStore
from tui.widgets.draft_view import REASONING_STYLE, DraftView
from tui.widgets.message_view import MessageView

pytestmark = pytest.mark.timeout(120)

REASONING, ANSWER = "hello world", "python function"
WRITTEN = "<think> hello world</think> python function"
CHAT: Any = [{"role": "user", "content": "hi there"}]  # each client package's own message type
GREEDY = {"temperature": 0}  # the anthropic package no longer sends it by name


# --- the split ------------------------------------------------------------------------------------


def split_in_pieces(
    text: str, cuts: list[int], inside: bool = False
) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, answer, each push's output) with `text` pushed in the pieces `cuts` make."""
    return pushed_in_pieces(ReasoningSplit(inside), text, cuts)


def pushed_in_pieces(
    split: StreamSplit, text: str, cuts: list[int]
) -> tuple[str, str, list[tuple[str, str]]]:
    """What `split` gives out for `text` pushed in the pieces `cuts` make, then finished; what it
    gave out agrees with what it holds as said."""
    bounds = [0, *cuts, len(text)]
    outs = [split.push(text[a:b]) for a, b in itertools.pairwise(bounds)]
    outs.append(split.finish())
    reasoning, answer = "".join(o[0] for o in outs), "".join(o[1] for o in outs)
    assert (reasoning, answer) == (split.reasoning, split.answer)
    return reasoning, answer, outs


CASES = [
    # (text, inside, reasoning, answer)
    (WRITTEN, False, REASONING, ANSWER),
    ("\n<think>\nweigh it\n</think>\n\nThe answer.", False, "weigh it\n", "The answer."),
    ("plain answer, no block", False, "", "plain answer, no block"),
    ("  indented answer", False, "", "  indented answer"),
    ("a <think> later is text", False, "", "a <think> later is text"),
    (" weigh it</think> answer", True, "weigh it", "answer"),
    ("<think>cut short by max_tokens", False, "cut short by max_tokens", ""),
    ("<think>ends on a tag's start </thi", False, "ends on a tag's start </thi", ""),
    ("<thi", False, "", "<thi"),
    ("<think>a < b and </thinker> too</think>ok", False, "a < b and </thinker> too", "ok"),
    ("\n\n", False, "", ""),
]


@pytest.mark.parametrize(("text", "inside", "reasoning", "answer"), CASES)
def test_the_split_is_the_same_wherever_the_chunks_are_cut(
    text: str, inside: bool, reasoning: str, answer: str
) -> None:
    assert split_in_pieces(text, [], inside)[:2] == (reasoning, answer)
    for cut in range(1, len(text)):
        assert split_in_pieces(text, [cut], inside)[:2] == (reasoning, answer), cut
    assert split_in_pieces(text, list(range(1, len(text))), inside)[:2] == (reasoning, answer)


def test_reasoning_streams_before_the_block_closes() -> None:
    """Only a tag's possible start is held back: the rest of the reasoning goes out at once."""
    _, _, outs = split_in_pieces("<think>one two </th", [7, 11, 15])
    assert outs[:3] == [("", ""), ("one ", ""), ("two ", "")]


def test_which_templates_think() -> None:
    assert thinks(tinymodels.THINKING_TEMPLATE)
    assert thinks(tinymodels.OPENED_THINKING_TEMPLATE)
    assert not thinks(tinymodels.HERMES_TEMPLATE)
    assert not thinks(None)
    assert opens_inside("<|im_start|>assistant\n<think>\n")
    assert not opens_inside("<|im_start|>assistant\n<think>\n\n</think>")


# --- the engine ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("thinking-models")
    tinymodels.write_thinking_target(folder / "think.gguf")
    tinymodels.write_thinking_target(folder / "think-open.gguf", tinymodels.OPENED_THINKING_TEMPLATE)
    tinymodels.write_thinking_tools_target(folder / "think-tools.gguf")
    tinymodels.write_target(folder / "plain.gguf")
    return folder


def engine(path: Path) -> Engine:
    return Engine(EngineConfig(target=path, load=LoadOptions(n_ctx=512, n_threads=1)))


def streamed(eng: Engine, req: GenerationRequest) -> tuple[list[TokenChunk], GenerationResult]:
    handle = eng.submit(req)
    chunks = list(handle)
    assert handle.result is not None
    return chunks, handle.result


def ask(**fields: Any) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", "hi there"),), **{"max_tokens": 20, **fields})


@pytest.mark.parametrize("method", ["none", "ngram", "auto"])
def test_the_engine_splits_a_thinking_reply_streamed_and_whole(models: Path, method: Method) -> None:
    with engine(models / "think.gguf") as eng:
        req = ask(speculative=SpecParams(method=method))
        chunks, result = streamed(eng, req)
        whole = eng.generate(req)
    assert (result.reasoning, result.text) == (REASONING, ANSWER)
    assert (whole.reasoning, whole.text) == (REASONING, ANSWER)
    assert "".join(c.reasoning for c in chunks) == REASONING
    assert "".join(c.text for c in chunks) == ANSWER
    assert result.finish_reason == "stop"


def test_a_prompt_that_opens_the_block_starts_the_reply_inside_it(models: Path) -> None:
    with engine(models / "think-open.gguf") as eng:
        result = eng.generate(ask())
        kept = eng.generate(ask(split_reasoning=False))
    assert (result.reasoning, result.text) == (REASONING, ANSWER)
    assert (kept.reasoning, kept.text) == ("", " hello world</think> python function")


def test_enable_thinking_reaches_the_template_and_the_split_can_be_left_off(models: Path) -> None:
    with engine(models / "think.gguf") as eng:
        off = eng.generate(ask(template_kwargs={"enable_thinking": False}))
        raw = eng.generate(ask(split_reasoning=False))
        on = eng.generate(ask())
    # The template closed an empty block in the prompt, and the model went on from there.
    assert off.stats.prompt_tokens > on.stats.prompt_tokens
    assert (off.reasoning, off.text) == ("", " python function")
    assert (raw.reasoning, raw.text) == ("", WRITTEN)


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
TOOLS = (ToolSpec("get_time", "The time now", {"type": "object", "properties": {}}),)


@pytest.mark.parametrize("model", ["think.gguf", "think-open.gguf"])
def test_a_schema_holds_the_answer_after_the_reasoning(models: Path, model: str) -> None:
    """A grammar lets a thinking model reason first and holds what follows (llguidance reads the
    tags as special tokens, which no free text of a grammar can hold: the grammar names them)."""
    with engine(models / model) as eng:
        result = eng.generate(ask(json_schema=SCHEMA, max_tokens=40))
    assert result.reasoning == REASONING
    assert isinstance(json.loads(result.text)["ok"], bool)


@pytest.mark.parametrize("model", ["think.gguf", "think-open.gguf"])
def test_a_grammar_of_the_requests_own_holds_the_answer_after_the_reasoning(models: Path, model: str) -> None:
    """The same for a request's own grammar (llama-server's GBNF here): it is a grammar apart,
    which the one around it names after the reasoning, so its rules cannot clash with that one's
    (this one has an `answer` too)."""
    answer = gbnf_lark('root ::= " " answer\nanswer ::= "yes" | "no"', "grammar")
    with engine(models / model) as eng:
        result = eng.generate(ask(grammar=answer, max_tokens=40))
    assert (result.reasoning, result.text) in ((REASONING, "yes"), (REASONING, "no"))


def test_a_thinking_budget_closes_the_block_and_the_answer_follows(models: Path) -> None:
    """Past its budget the reasoning's block is closed for the model (a grammar), and it answers."""
    with engine(models / "think.gguf") as eng:
        one = eng.generate(ask(thinking_budget=1))
        ample = eng.generate(ask(thinking_budget=50))
    with engine(models / "think-open.gguf") as eng:
        none = eng.generate(ask(thinking_budget=0))
    assert (one.reasoning, one.text) == ("hello", ANSWER)
    assert (ample.reasoning, ample.text) == (REASONING, ANSWER)  # a bound it stays within changes nothing
    assert (none.reasoning, none.text) == ("", ANSWER)  # the block the prompt opened, closed at once


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_thinking_model_calls_a_tool_after_its_reasoning(models: Path, choice: ToolChoice) -> None:
    """Qwen3's way: the reasoning, then a call. With tools offered, the call's grammar (lazy for
    auto) still lets the model think first."""
    with engine(models / "think-tools.gguf") as eng:
        result = eng.generate(ask(tools=TOOLS, tool_choice=choice, max_tokens=60))
    assert result.reasoning == "hello"
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_time", {})]
    assert result.finish_reason == "tool_calls" and result.text == ""


def test_the_reasoning_of_earlier_turns_reaches_the_template(models: Path) -> None:
    history = (
        ChatMessage("user", "hi there"),
        ChatMessage("assistant", ANSWER, reasoning="a long train of thought"),
        ChatMessage("user", "and again"),
    )
    with engine(models / "think.gguf") as eng:
        shown = eng.generate(GenerationRequest(messages=history, max_tokens=20))
        bare = eng.generate(
            GenerationRequest(messages=(*history[:1], ChatMessage("assistant", ANSWER), history[2]))
        )
    assert shown.stats.prompt_tokens > bare.stats.prompt_tokens
    assert (shown.reasoning, shown.text) == (REASONING, ANSWER)


# --- the APIs, with their own client packages --------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, models: Path) -> Iterator[Daemon]:
    pins = {name: "none" for name in ("think", "think-open", "think-tools", "plain")}
    env = {"LOCALSPEC_MODELS": str(models), "LOCALSPEC_DRAFTS": json.dumps(pins)}
    d = start_daemon(tmp_path_factory.mktemp("thinking-home"), models / "think.gguf", ctx=512, env=env)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def oai(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai(max_retries=0) as client:
        yield client


def test_openai_chat_carries_reasoning_content(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(model="think", messages=CHAT, temperature=0)
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert (message.model_extra or {})["reasoning_content"] == REASONING
    # "hello world": two of the reply's tokens (with its tags and "python function", 7 with the end).
    assert reply.usage is not None and reply.usage.completion_tokens_details is not None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 2

    stream = oai.chat.completions.create(model="think", messages=CHAT, temperature=0, stream=True)
    reasoning, content = "", ""
    for chunk in stream:
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (REASONING, ANSWER)


def test_openai_tool_calls_after_the_reasoning(oai: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    reply = oai.chat.completions.create(model="think-tools", messages=CHAT, temperature=0, tools=tools)
    message = reply.choices[0].message
    assert (message.model_extra or {})["reasoning_content"] == "hello"
    assert message.tool_calls is not None
    assert [c.function.name for c in message.tool_calls] == ["get_time"]  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


def test_openai_chat_takes_chat_template_kwargs_and_reasoning_format(oai: openai.OpenAI) -> None:
    off = oai.chat.completions.create(
        model="think",
        messages=CHAT,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert off.choices[0].message.content == " python function"
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    raw = oai.chat.completions.create(
        model="think",
        messages=CHAT,
        temperature=0,
        extra_body={"reasoning_format": "none"},
    )
    assert raw.choices[0].message.content == WRITTEN


def test_openai_chat_sends_earlier_reasoning_to_the_template(oai: openai.OpenAI) -> None:
    def prompt_tokens(assistant: dict[str, Any]) -> int:
        messages = [*CHAT, {"role": "assistant", **assistant}, {"role": "user", "content": "and again"}]
        reply = oai.chat.completions.create(model="think", messages=messages, temperature=0)
        assert reply.usage is not None
        return reply.usage.prompt_tokens

    bare = prompt_tokens({"content": ANSWER})
    shown = prompt_tokens({"content": ANSWER, "reasoning_content": "a long train of thought"})
    assert shown > bare
    assert prompt_tokens({"content": ANSWER, "reasoning": "a long train of thought"}) == shown


def test_ollama_chat_and_generate_carry_thinking(daemon: Daemon) -> None:
    with daemon.ollama() as client:
        assert "thinking" in (client.show("think").capabilities or [])
        assert "thinking" not in (client.show("plain").capabilities or [])
        default = client.chat(model="think", messages=CHAT, options={"temperature": 0})
        assert (default.message.thinking, default.message.content) == (REASONING, ANSWER)
        parts = list(
            client.chat(model="think", messages=CHAT, options={"temperature": 0}, think=True, stream=True)
        )
        assert "".join(p.message.thinking or "" for p in parts) == REASONING
        assert "".join(p.message.content for p in parts) == ANSWER
        off = client.chat(model="think", messages=CHAT, options={"temperature": 0}, think=False)
        assert (off.message.thinking, off.message.content) == (None, " python function")
        generated = client.generate(model="think", prompt="hi there", options={"temperature": 0})
        assert (generated.thinking, generated.response) == (REASONING, ANSWER)
        opened = client.chat(model="think-open", messages=CHAT, options={"temperature": 0})
        assert (opened.message.thinking, opened.message.content) == (REASONING, ANSWER)
        with pytest.raises(ollama.ResponseError, match="does not support thinking") as refused:
            client.chat(model="plain", messages=CHAT, think=True)
        assert refused.value.status_code == 400


def test_ollama_sends_earlier_thinking_to_the_template(daemon: Daemon) -> None:
    with daemon.http() as http:

        def prompt_tokens(assistant: dict[str, Any]) -> int:
            messages = [*CHAT, {"role": "assistant", **assistant}, {"role": "user", "content": "and again"}]
            body = {"model": "think", "messages": messages, "stream": False, "options": {"temperature": 0}}
            count: int = http.post("/api/chat", json=body).json()["prompt_eval_count"]
            return count

        assert prompt_tokens({"content": ANSWER, "thinking": "a long train of thought"}) > prompt_tokens(
            {"content": ANSWER}
        )


def test_anthropic_messages_carry_thinking_blocks(daemon: Daemon) -> None:
    with daemon.anthropic(max_retries=0) as client:
        message = client.messages.create(
            model="think",
            max_tokens=20,
            extra_body=GREEDY,
            messages=[{"role": "user", "content": "hi there"}],
        )
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == REASONING  # type: ignore[union-attr]
        assert message.content[1].text == ANSWER  # type: ignore[union-attr]

        with client.messages.stream(
            model="think",
            max_tokens=20,
            extra_body=GREEDY,
            messages=[{"role": "user", "content": "hi there"}],
        ) as stream:
            events = list(stream)
            final = stream.get_final_message()
        assert [
            (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content
        ] == [
            ("thinking", REASONING),
            ("text", ANSWER),
        ]
        starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
        assert starts == [(0, "thinking"), (1, "text")]

        # The blocks sent back, as Claude Code does, are read, not refused.
        history: Any = [
            {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {"role": "user", "content": "and again"},
        ]
        again = client.messages.create(
            model="think",
            max_tokens=20,
            extra_body=GREEDY,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=history,
        )
        assert [b.type for b in again.content] == ["thinking", "text"]
        # budget_tokens bounds the reasoning (Anthropic asks for 1,024 at least; the tiny model's is 2).
        bounded = client.messages.create(
            model="think",
            max_tokens=20,
            extra_body=GREEDY,
            thinking={"type": "enabled", "budget_tokens": 1},
            messages=[{"role": "user", "content": "hi there"}],
        )
        assert [
            (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in bounded.content
        ] == [
            ("thinking", "hello"),
            ("text", ANSWER),
        ]


def test_anthropic_thinking_then_a_tool_use_as_claude_code_reads_them(daemon: Daemon) -> None:
    """The reasoning's block first, then the call's, each with its own index, streamed and whole."""
    tools: Any = [{"name": "get_time", "description": "The time now", "input_schema": {"type": "object"}}]
    asked: Any = {"model": "think-tools", "max_tokens": 60, "extra_body": GREEDY, "tools": tools}
    with daemon.anthropic(max_retries=0) as client:
        message = client.messages.create(**asked, messages=[{"role": "user", "content": "what time is it"}])
        with client.messages.stream(
            **asked, messages=[{"role": "user", "content": "what time is it"}]
        ) as stream:
            events = list(stream)
            final = stream.get_final_message()
    for reply in (message, final):
        assert [b.type for b in reply.content] == ["thinking", "tool_use"]
        assert reply.content[0].thinking == "hello"  # type: ignore[union-attr]
        assert reply.content[1].name == "get_time" and reply.content[1].input == {}  # type: ignore[union-attr]
        assert reply.stop_reason == "tool_use"
    blocks = [(e.type, e.index) for e in events if e.type in ("content_block_start", "content_block_stop")]
    assert blocks == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
    ]


def test_responses_carry_a_reasoning_item(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model="think", input="hi there", temperature=0)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == REASONING
    assert response.output_text == ANSWER
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 2

    with oai.responses.stream(model="think", input="hi there", temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == REASONING
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == ANSWER
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "message")]


# --- the chat app -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_chat_app_shows_the_reasoning_apart_and_keeps_the_answer(
    daemon: Daemon, localspec_home: Path
) -> None:
    client = daemon.client()
    store = ChatStore(localspec_home / "chats")
    app = make_app(load_settings(), client, store=store, max_tokens=20)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.health is not None)
            await type_and_send(pilot, "hi")
            await wait_until(pilot, lambda: len(app.chat.messages) == 2 and not app.generating)
            # The reasoning is kept beside the answer, to be shown again; the requests send the answer
            # alone, as thinking models' templates want earlier turns.
            assert app.chat.messages[-1] == ChatMessage("assistant", ANSWER, reasoning=REASONING)
            view = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
            assert view.source == f"> {REASONING}\n\n{ANSWER}"  # the reasoning quoted, then the answer
            await pilot.press("f2")  # the drafts' colours: plain text, the reasoning in its own style
            await type_and_send(pilot, "again")
            await wait_until(pilot, lambda: len(app.chat.messages) == 4 and not app.generating)
            spans = app.query_one(DraftView).spans
            assert spans[0] == (REASONING, REASONING_STYLE)
            assert "".join(text for text, _ in spans) == f"{REASONING}\n\n{ANSWER}"
        # Resumed, the chat shows the reasoning again, as it was shown.
        resumed = make_app(load_settings(), client, store=store, resume=app.chat.id, max_tokens=20)
        async with resumed.run_test(size=(80, 24)) as pilot:
            await wait_until(
                pilot, lambda: len([v for v in resumed.query(MessageView) if v.role == "assistant"]) == 2
            )
            first = next(v for v in resumed.query(MessageView) if v.role == "assistant")
            assert first.source == f"> {REASONING}\n\n{ANSWER}"
    finally:
        client.close()


def test_responses_reasoning_then_a_function_call(oai: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}]
    response = oai.responses.create(model="think-tools", input="what time is it", temperature=0, tools=tools)
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    with oai.responses.stream(
        model="think-tools", input="what time is it", temperature=0, tools=tools
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "function_call")]
