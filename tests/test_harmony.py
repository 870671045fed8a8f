"""gpt-oss's harmony format: its channels told apart, its calls read and forced, through every API.

The split is driven with the texts gpt-oss writes (as llama.cpp renders them: `<|end|>` as nothing,
or as text where a client asked for special tokens); the engine and the APIs with the tiny harmony
model (tinymodels.write_harmony_target), which writes analysis " hello world" and the final
answer " python function".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tinymodels
from daemonproc import Daemon, start_daemon
from test_reasoning import pushed_in_pieces

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.constraint import GrammarTokenizer, regex_lark
from localspec.engine.harmony import HarmonySplit, harmony
from localspec.engine.llama import LlamaModel
from localspec.engine.toolcalls import HARMONY, lazy_call_grammar, parse_tool_calls, tool_format
from localspec.engine.tooluse import ToolCallFilter, call_grammar_for, single_token
from localspec.engine.worker import Engine
from localspec.types import (
    CallDelta,
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    SpecParams,
    ToolCall,
    ToolSpec,
)

pytestmark = pytest.mark.timeout(120)

REASONING, ANSWER = " hello world", " python function"
CHAT: Any = [{"role": "user", "content": "hi there"}]

# What gpt-oss writes after `<|start|>assistant`, as llama.cpp renders it (`<|end|>` as nothing).
SUM = "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|start|>assistant<|channel|>final<|message|>4"
CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)
CASES = [
    # (text, reasoning, answer before the calls are read, calls)
    (SUM, "User asks 2+2. Answer 4.", "4", []),
    (SUM.replace("<|start|>", "<|end|><|start|>"), "User asks 2+2. Answer 4.", "4", []),
    (CALL, "Need the weather.", "", [ToolCall("get_weather", '{"city": "Paris"}')]),
    # The recipient in the role's header rather than the channel's.
    (
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_time<|channel|>commentary"
        " json<|message|>{}",
        "x",
        "",
        [ToolCall("get_time", "{}")],
    ),
    # A preamble to the user (commentary without a recipient) is answer, as llama.cpp reads it.
    (
        "<|channel|>commentary<|message|>Checking. <|end|><|start|>assistant<|channel|>final<|message|>Done.",
        "",
        "Checking. Done.",
        [],
    ),
    # gpt-oss sometimes prefixes its analysis with a stray commentary channel.
    ("<|channel|>commentary<|channel|>analysis<|message|>hm<|end|>", "hm", "", []),
    # Under a grammar that asked for no channel: all answer.
    ('{"ok": true}', "", '{"ok": true}', []),
    # Cut short by max_tokens: inside the analysis, or in a header.
    ("<|channel|>analysis<|message|>still think", "still think", "", []),
    ("<|channel|>analysis<|message|>done<|end|><|start|>assistant<|channel|>fin", "done", "", []),
    # Arguments that are no JSON: the call's text stays the answer's.
    (
        "<|channel|>commentary to=functions.f<|message|>not json",
        "",
        '<|call|>{"name": "f", "arguments": "not json"}<|end|>',
        [],
    ),
]


def split_in_pieces(text: str, cuts: list[int], reasoning: bool = True) -> tuple[str, str]:
    thought, said, _ = pushed_in_pieces(HarmonySplit(reasoning), text, cuts)
    return thought, said


@pytest.mark.parametrize(("text", "reasoning", "answer", "calls"), CASES)
def test_the_split_reads_every_message_whole_or_in_any_pieces(
    text: str, reasoning: str, answer: str, calls: list[ToolCall]
) -> None:
    whole = split_in_pieces(text, [])
    content, read = parse_tool_calls(HARMONY, whole[1])
    assert (whole[0], content if calls else whole[1], read) == (reasoning, answer, calls)
    for cut in range(1, len(text)):  # a marker cut across two chunks is held until it can be told
        assert split_in_pieces(text, [cut]) == whole, cut
    assert split_in_pieces(text, list(range(1, len(text)))) == whole  # a character a chunk


def test_reasoning_unsplit_goes_to_the_answer_before_it() -> None:
    assert split_in_pieces(SUM, [7, 40]) == ("User asks 2+2. Answer 4.", "4")
    assert split_in_pieces(SUM, [7, 40], reasoning=False) == ("", "User asks 2+2. Answer 4.\n\n4")


def test_a_call_never_streams_as_content() -> None:
    """The split then the stream's filter, as the engine chains them: a preamble streams, the call
    is held and read at the end."""
    text = "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant" + CALL.removeprefix(
        "<|channel|>analysis<|message|>Need the weather.<|start|>assistant"
    )
    split, calls = HarmonySplit(), ToolCallFilter(HARMONY, parallel=True)
    streamed = "".join(calls.push(split.push(text[i : i + 5])[1]) for i in range(0, len(text), 5))
    streamed += calls.push(split.finish()[1])
    assert streamed == "Let me look."
    tail, result = calls.finish(GenerationResult(split.answer, (), "stop", GenerationStats()))
    assert (tail, result.text, result.finish_reason) == ("", "Let me look.", "tool_calls")
    assert result.tool_calls == (ToolCall("get_weather", '{"city": "Paris"}'),)


def _split_and_filter(text: str, step: int) -> tuple[str, list[CallDelta], GenerationResult, bool]:
    """The split streaming calls, then the filter, as the engine chains them where a grammar holds
    the call: the content streamed, the call pieces, the result, and whether a piece came before
    the reply's end."""
    split, calls = HarmonySplit(stream_calls=True), ToolCallFilter(HARMONY, parallel=False, stream_calls=True)
    streamed, pieces = "", list[CallDelta]()
    for i in range(0, len(text), step):
        streamed += calls.push(split.push(text[i : i + step])[1])
        pieces += calls.call_deltas()
    early = bool(pieces)
    streamed += calls.push(split.finish()[1])
    pieces += calls.call_deltas()
    finish = "stop" if text.endswith("}") else "length"
    tail, result = calls.finish(GenerationResult(split.answer, (), finish, GenerationStats()))  # type: ignore[arg-type]
    return streamed + tail, pieces, result, early


def test_a_held_calls_arguments_stream_as_written() -> None:
    # Where a grammar holds the body to JSON, its call streams as any family's: the name, then the
    # arguments piece by piece, the result's arguments the text streamed.
    body = '{"city": "Paris", "days": 3}'
    text = CALL.replace('{"city": "Paris"}', body)
    streamed, pieces, result, early = _split_and_filter(text, 4)
    assert streamed == "" and early and pieces[0].name == "get_weather" and len(pieces) > 3
    assert "".join(p.arguments for p in pieces) == result.tool_calls[0].arguments == body
    assert result.finish_reason == "tool_calls" and result.reasoning == ""
    # Cut by max_tokens inside the arguments: the call cut short, never a call of text arguments.
    cut = text[: -len("3}")]
    _, pieces, result, _ = _split_and_filter(cut, 4)
    assert not result.tool_calls and result.cut_call == ToolCall("get_weather", '{"city": "Paris", "days": ')
    assert "".join(p.arguments for p in pieces) == result.cut_call.arguments


def test_an_answer_that_is_json_is_no_call() -> None:
    """Other families read an answer that is bare JSON as a call the model wrote without its
    markers; harmony keeps its calls in their own messages, so a JSON answer stays an answer."""
    answer = '{"name": "get_time", "arguments": {}}'
    assert parse_tool_calls(HARMONY, answer) == (answer, [])
    calls = ToolCallFilter(HARMONY, parallel=False)
    assert calls.push(answer) == answer


def test_the_template_is_known_by_its_channels() -> None:
    assert harmony(tinymodels.HARMONY_TEMPLATE) and tool_format(tinymodels.HARMONY_TEMPLATE) is HARMONY
    assert not harmony(tinymodels.THINKING_TEMPLATE) and not harmony(None)


# --- the engine ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("harmony-models")
    tinymodels.write_harmony_target(root / "gpt-oss-tiny.gguf")
    return root


def engine(path: Path) -> Engine:
    return Engine(EngineConfig(target=path, draft=None, load=LoadOptions(n_ctx=512, n_threads=1)))


def ask(**kwargs: Any) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", "hi there"),), **{"max_tokens": 30, **kwargs})


TIME = ToolSpec("get_time", "The time now", {"type": "object", "properties": {}})


def test_the_engine_splits_a_reply_and_counts_its_reasoning(models: Path) -> None:
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        result = eng.generate(ask())
        raw = eng.generate(ask(split_reasoning=False))
    assert (result.reasoning, result.text) == (REASONING, ANSWER)
    assert 0 < result.stats.reasoning_tokens < result.stats.tokens and result.finish_reason == "stop"
    assert (raw.reasoning, raw.text) == ("", REASONING + "\n\n" + ANSWER)


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_forced_call_comes_after_the_analysis(models: Path, choice: str) -> None:
    """tool_choice required: the grammar lets the model write its analysis, then writes the call's
    message, as llama.cpp constrains gpt-oss. auto: the lazy grammar leaves a reply that names no
    function free, and the model answers as it would without it."""
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        result = eng.generate(ask(tools=(TIME,), tool_choice=choice, max_tokens=60))
    assert result.reasoning == REASONING
    if choice == "required":
        assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_time", {})]
        assert (result.text, result.finish_reason) == ("", "tool_calls")
    else:
        assert (result.text, result.tool_calls) == (ANSWER, ())


def test_a_forced_calls_arguments_stream_from_the_engine(models: Path) -> None:
    """The engine's stream: the call's name and arguments in its chunks as the grammar writes
    them, joined the call the result holds; none of it as content."""
    # The random model ends no free string, nor an object that may take more keys.
    city = {"type": "string", "enum": ["Paris", "London"]}
    schema = {
        "type": "object",
        "properties": {"city": city},
        "required": ["city"],
        "additionalProperties": False,
    }
    tool = ToolSpec("get_weather", "", schema)
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        handle = eng.submit(ask(tools=(tool,), tool_choice="required", max_tokens=80), stream=True)
        chunks = []
        while not isinstance(event := handle.next_event(timeout=60), GenerationResult):
            assert not isinstance(event, BaseException), event
            chunks.append(event)
    pieces = [d for c in chunks for d in c.calls]
    (call,) = event.tool_calls
    assert pieces and pieces[0].name == "get_weather" and all(p.name == "" for p in pieces[1:])
    assert "".join(p.arguments for p in pieces) == call.arguments and "city" in json.loads(call.arguments)
    assert len(pieces) > 2  # as the grammar wrote it, not whole at the end
    assert "".join(c.text for c in chunks) == "" and event.finish_reason == "tool_calls"


WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
_MARKER = re.compile(r"(<\|[a-z]+\|>)")


def harmony_tokens(model: LlamaModel, text: str) -> list[int]:
    """`text`'s tokens as gpt-oss writes them: each marker one token, the text between as it is,
    a character a token (the tiny vocabulary's tokenizer puts a space before every piece)."""
    byte_piece = {model.piece(t): t for t in reversed(range(model.n_vocab))}
    tokens: list[int] = []
    for part in filter(None, _MARKER.split(text)):
        if _MARKER.fullmatch(part):
            tokens += model.tokenize(part, add_special=False, parse_special=True)
        else:
            tokens += [byte_piece[c.encode()] for c in part]
    return tokens


def test_in_auto_mode_a_header_that_names_a_function_holds_the_call(models: Path) -> None:
    """tool_choice auto, as llama.cpp's lazy grammar holds gpt-oss: whatever it writes passes (its
    analysis, preambles, answers, calls in the channel's or the role's header, a built-in tool's
    call); once a header names a function, the name is one of the tools' and the body its arguments."""
    model = LlamaModel(models / "gpt-oss-tiny.gguf", LoadOptions(n_ctx=256, n_threads=1))
    try:
        request = GenerationRequest(messages=(ChatMessage("user", "hi"),), tools=(WEATHER, TIME))
        grammar = call_grammar_for(model, HARMONY, request)
        assert grammar is not None
        grammars = GrammarTokenizer(model)

        def taken(text: str, lark: str = grammar) -> str:
            """The part of `text` the grammar takes."""
            tokens = harmony_tokens(model, text)
            n = grammars.constraint(lark).valid_prefix(tokens)
            return b"".join(model.piece(t) for t in tokens[:n]).decode()

        def forced(text: str) -> str:
            constraint = grammars.constraint(grammar)
            for token in harmony_tokens(model, text):
                constraint.accept(token)
            return b"".join(model.piece(t) for t in constraint.forced()).decode()

        for text, *_ in CASES[:-1]:
            assert taken(text) == text
        builtin = '<|channel|>commentary to=browser.search<|message|>{"query": 1}'
        said = "<|channel|>analysis<|message|>Call to=functions.get_time later.<|end|>"
        assert taken(builtin) == builtin and taken(said) == said
        # Named in the channel's header, or in the role's.
        opened = "<|start|>assistant<|channel|>commentary to=functions."
        assert forced(opened + "get_w") == "eather"
        body = opened + "get_weather <|constrain|>json<|message|>"
        assert forced(body) == "{" and forced(body + '{"city"') == ""
        # Its JSON compact, as gpt-oss often writes it, or spaced, but no run of spaces.
        for args in ('{"city":"Paris"}', '{"city": "Paris"}', '{ "city" : "Paris" }'):
            assert taken(body + args) == body + args
        assert taken(body + '{"city":  "Paris"}') == body + '{"city": '
        assert forced("<|start|>assistant to=functions.get_t") == "ime<|channel|>"
        assert taken(opened + "nope") == opened
        called = opened + "get_weather<|message|>"
        assert taken(called + '{"town": "Paris"}') == called + '{"'
        assert taken(CASES[-1][0]).endswith("to=functions.")  # f is no tool
        # Under a budget, one analysis at most, first: a later header may not open another.
        bounded = lazy_call_grammar(HARMONY, (WEATHER,), False, lambda m: single_token(model, m), 50)
        assert bounded is not None
        second = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>analysis"
        assert taken(second, bounded) == second.removesuffix("s")
        assert taken(second, grammar) == second  # no budget: as many analyses as it writes
        assert taken(CASES[1][0], bounded) == CASES[1][0]
    finally:
        model.close()
    # A marker that is no single token: a header could not be told from text, so no grammar.
    assert lazy_call_grammar(HARMONY, (WEATHER,), False, lambda m: None if "channel" in m else 1) is None


@pytest.mark.parametrize("tools", [(), (TIME,)])
def test_a_thinking_budget_bounds_the_analysis(models: Path, tools: tuple[ToolSpec, ...]) -> None:
    """Anthropic's budget_tokens: past it the grammar closes the analysis and opens the final
    message (what the tiny model writes there, pushed off its script, is not asserted); 0: none.
    With tools (tool_choice auto), the call's lazy grammar bounds it, and no later header opens
    another analysis."""
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        one = eng.generate(ask(thinking_budget=1, tools=tools))
        ample = eng.generate(ask(thinking_budget=50, tools=tools))
        none = eng.generate(ask(thinking_budget=0, tools=tools))
    assert (one.reasoning, ample.reasoning, none.reasoning) == (" hello", REASONING, "")
    assert all("<|channel|>" not in r.text and "analysis" not in r.text for r in (one, ample, none))


def test_a_drafted_end_of_message_leaves_the_grammar_as_it_was(models: Path) -> None:
    """Walking a draft to find where the grammar forces its own tokens must leave the grammar where it
    was: llguidance's rollback of gpt-oss's <|end|> (the analysis message's end, under the budget's
    grammar) left the matcher stopped, allowing nothing but the end of generation."""
    model = LlamaModel(models / "gpt-oss-tiny.gguf", LoadOptions(n_ctx=256, n_threads=1))
    try:
        hi = (ChatMessage("user", "hi"),)
        request = GenerationRequest(messages=hi, tools=(WEATHER,), thinking_budget=50)
        grammar = call_grammar_for(model, HARMONY, request)
        assert grammar is not None
        constraint = GrammarTokenizer(model).constraint(grammar)
        for token in harmony_tokens(model, "<|channel|>analysis<|message|>hello"):
            constraint.accept(token)
        before = constraint.allowed().copy()
        draft = model.tokenize("<|end|><|start|>assistant", add_special=False, parse_special=True)
        assert constraint.valid_prefix(draft) == len(draft)
        assert constraint.free_prefix(draft) >= 1
        assert (constraint.allowed() == before).all() and not constraint.finished
    finally:
        model.close()


def test_an_ngram_copy_of_the_last_reply_under_a_budget_is_judged_like_any_draft(models: Path) -> None:
    """After a reply whose analysis a budget of 1 cut (` hello<|end|>...`), the n-gram drafter copies
    that <|end|> after the next reply's first word: a budget of 50 must still give the whole
    analysis, as plain decoding does (it gave ` hello` and an empty answer)."""
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        replies = {}
        for method in ("none", "ngram"):
            eng.generate(ask(thinking_budget=1, speculative=SpecParams(method, 4)))
            replies[method] = eng.generate(ask(thinking_budget=50, speculative=SpecParams(method, 4)))
    assert replies["none"].reasoning == REASONING
    assert replies["ngram"].token_ids == replies["none"].token_ids
    assert replies["ngram"].stats.method_steps.get("ngram", 0) > 0  # it did draft


def test_a_json_schema_holds_the_final_message(models: Path) -> None:
    ok = {"ok": {"type": "boolean"}}
    schema = {"type": "object", "properties": ok, "required": ["ok"], "additionalProperties": False}
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        result = eng.generate(ask(json_schema=schema, max_tokens=60))
    assert result.reasoning == REASONING
    assert isinstance(json.loads(result.text)["ok"], bool)


def test_a_grammar_of_the_requests_own_holds_the_final_message(models: Path) -> None:
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        result = eng.generate(ask(grammar=regex_lark("[0-9]{3}", "guided_regex"), max_tokens=60))
    assert result.reasoning == REASONING
    assert re.fullmatch("[0-9]{3}", result.text) and result.finish_reason == "stop"


def test_earlier_reasoning_and_calls_reach_the_template(models: Path) -> None:
    """gpt-oss's template reads an earlier turn's reasoning as `thinking`."""
    call = ChatMessage(
        "assistant", "", tool_calls=(ToolCall("get_time", "{}", id="c1"),), reasoning="need it"
    )
    history = (
        ChatMessage("user", "hi there"),
        call,
        ChatMessage("tool", "noon", tool_call_id="c1", name="get_time"),
    )
    with engine(models / "gpt-oss-tiny.gguf") as eng:
        shown = eng.generate(GenerationRequest(messages=history, tools=(TIME,), max_tokens=30))
        bare = eng.generate(
            GenerationRequest(
                messages=(history[0], ChatMessage("assistant", "", tool_calls=call.tool_calls), history[2]),
                tools=(TIME,),
                max_tokens=30,
            )
        )
    assert shown.stats.prompt_tokens > bare.stats.prompt_tokens
    assert (shown.reasoning, shown.text) == (REASONING, ANSWER)


def test_a_call_turn_with_a_preamble_and_reasoning_renders(models: Path) -> None:
    """A client sends back the call's turn as it got it: a preamble as content, the analysis as
    reasoning. gpt-oss's template refuses both in one call's turn; the reasoning is kept (llama.cpp
    keeps it too), and the preamble's text is no longer in the prompt."""
    calls = (ToolCall("get_time", "{}", id="c1"),)
    result = ChatMessage("tool", "noon", tool_call_id="c1", name="get_time")

    def prompt(call: ChatMessage) -> GenerationResult:
        history = (ChatMessage("user", "hi there"), call, result)
        return eng.generate(GenerationRequest(messages=history, tools=(TIME,), max_tokens=30))

    with engine(models / "gpt-oss-tiny.gguf") as eng:
        both = prompt(ChatMessage("assistant", "class import", tool_calls=calls, reasoning="need it"))
        reasoning = prompt(ChatMessage("assistant", "", tool_calls=calls, reasoning="need it"))
    assert both.stats.prompt_tokens == reasoning.stats.prompt_tokens
    assert (both.reasoning, both.text) == (REASONING, ANSWER)


# --- the APIs, with their own client packages ---------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, models: Path) -> Iterator[Daemon]:
    env = {"LOCALSPEC_MODELS": str(models), "LOCALSPEC_DRAFTS": json.dumps({"gpt-oss-tiny": "none"})}
    d = start_daemon(tmp_path_factory.mktemp("harmony-home"), models / "gpt-oss-tiny.gguf", ctx=512, env=env)
    yield d
    assert d.stop() == 0, d.log()


def test_openai_chat_carries_reasoning_content(daemon: Daemon) -> None:
    with daemon.openai(max_retries=0) as oai:
        reply = oai.chat.completions.create(model="gpt-oss-tiny", messages=CHAT, temperature=0)
        stream = oai.chat.completions.create(model="gpt-oss-tiny", messages=CHAT, temperature=0, stream=True)
        reasoning, content = "", ""
        for chunk in stream:
            for choice in chunk.choices:
                reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
                content += choice.delta.content or ""
        tools: Any = [
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        ]
        called = oai.chat.completions.create(
            model="gpt-oss-tiny", messages=CHAT, temperature=0, tools=tools, tool_choice="required"
        )
    message = reply.choices[0].message
    assert (message.content, (message.model_extra or {})["reasoning_content"]) == (ANSWER, REASONING)
    assert (content, reasoning) == (ANSWER, REASONING)
    assert called.choices[0].finish_reason == "tool_calls" and called.choices[0].message.tool_calls
    assert [c.function.name for c in called.choices[0].message.tool_calls] == ["get_time"]  # type: ignore[union-attr]


def test_ollama_shows_thinking_and_tools_and_carries_thinking(daemon: Daemon) -> None:
    """gpt-oss takes Ollama's levels as its effort; it cannot answer without its analysis, so
    `think: false` asks for the least (low), still apart, as clients of Ollama expect."""
    with daemon.ollama() as client:
        capabilities = client.show("gpt-oss-tiny").capabilities or []
        replies = {
            think: client.chat(model="gpt-oss-tiny", messages=CHAT, options={"temperature": 0}, think=think)
            for think in (None, "low", False)
        }
    assert {"thinking", "tools"} <= set(capabilities)
    for reply in replies.values():
        assert (reply.message.thinking, reply.message.content) == (REASONING, ANSWER)
    low, off, default = (replies[t].prompt_eval_count or 0 for t in ("low", False, None))
    assert low == off > default  # "Reasoning: low" in the prompt


def test_anthropic_messages_carry_a_thinking_block(daemon: Daemon) -> None:
    with daemon.anthropic(max_retries=0) as client:
        reply = client.messages.create(
            model="gpt-oss-tiny",
            max_tokens=30,
            messages=CHAT,
            extra_body={"temperature": 0},
        )
        # output_config.effort reaches the template as its reasoning_effort ("max" as "high").
        default = client.messages.count_tokens(model="gpt-oss-tiny", messages=CHAT).input_tokens
        counted = [default] + [
            client.messages.count_tokens(
                model="gpt-oss-tiny", messages=CHAT, output_config={"effort": effort}
            ).input_tokens
            for effort in ("max", "high")
        ]
    kinds = [
        (block.type, getattr(block, "thinking", None) or getattr(block, "text", None))
        for block in reply.content
    ]
    assert kinds == [("thinking", REASONING), ("text", ANSWER)]
    assert counted[0] < counted[1] == counted[2]


def test_openai_is_what_llama_server_sends(daemon: Daemon) -> None:
    """The same bytes a client reads from llama-server for gpt-oss: `reasoning_content` beside
    `content`, no channel markers in either."""
    with daemon.http() as http:
        body = {"model": "gpt-oss-tiny", "messages": CHAT, "temperature": 0}
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["content"] == ANSWER and message["reasoning_content"] == REASONING
    assert "<|" not in json.dumps(message)


def test_responses_carry_the_analysis_then_the_call_as_codex_reads_them(daemon: Daemon) -> None:
    """Codex drives gpt-oss through the Responses API: a reasoning item, then the function call."""
    tools: Any = [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}]
    with daemon.openai(max_retries=0) as oai:
        answered = oai.responses.create(model="gpt-oss-tiny", input="hi there", temperature=0)
        with oai.responses.stream(
            model="gpt-oss-tiny", input="what time is it", temperature=0, tools=tools, tool_choice="required"
        ) as stream:
            events = list(stream)
            called = stream.get_final_response()
        # Codex's own choice: auto, under the lazy call grammar; a reply that names no function is free.
        free = oai.responses.create(
            model="gpt-oss-tiny", input="hi there", temperature=0, tools=tools, tool_choice="auto"
        )
    assert [item.type for item in answered.output] == ["reasoning", "message"]
    assert answered.output_text == ANSWER
    assert [item.type for item in free.output] == ["reasoning", "message"] and free.output_text == ANSWER
    assert [item.type for item in called.output] == ["reasoning", "function_call"]
    call = called.output[1]
    assert call.type == "function_call" and (call.name, json.loads(call.arguments)) == ("get_time", {})
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == REASONING
