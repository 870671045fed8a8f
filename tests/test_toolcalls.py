"""Tool calls: template families, parsing, the streaming filter, and forced calls on tiny models.

The engine tests run a tiny model whose chat template speaks the Hermes/Qwen syntax: the
tools must reach the prompt, a forced call must come back parsed and valid against the
tool's schema, and greedy output under the call grammar must be identical for every method.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import tinymodels
from test_engine import TINY, make_engine

from localspec.engine.constraint import GrammarTokenizer, lark_grammar
from localspec.engine.drafters.base import Draft
from localspec.engine.llama import LlamaModel
from localspec.engine.sampling import Draws
from localspec.engine.speculative import FixedPolicy, Generation
from localspec.engine.toolcalls import (
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    call_grammar,
    lazy_call_grammar,
    parse_tool_calls,
    supports_tools,
    tool_format,
)
from localspec.engine.tooluse import ToolCallFilter, call_grammar_for, single_token
from localspec.engine.worker import Engine
from localspec.errors import UnsupportedModelError, UserInputError
from localspec.types import (
    AllowedTools,
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    Method,
    NamedTool,
    SamplingParams,
    SpecParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
    parallel_calls,
)

WEATHER = ToolSpec(
    "get_weather",
    "Current weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
    },
)
TIME = ToolSpec("get_time", "The time now", {"type": "object", "properties": {}})


# --- families and parsing (pure) ---------------------------------------------------------


def test_families_are_read_from_the_template() -> None:
    assert tool_format(tinymodels.HERMES_TEMPLATE) == HERMES
    assert tool_format("{{ tools }} [TOOL_CALLS] {{ messages }}") == MISTRAL
    assert tool_format("<|start_header_id|>{% if tools %}{{ tools | tojson }}{% endif %}") == LLAMA3
    assert tool_format("{% for t in tools %}{{ t | tojson }}{% endfor %}") == GENERIC
    assert tool_format(tinymodels.CHATML_TEMPLATE) is None
    assert not supports_tools(None) and not supports_tools("")
    assert supports_tools(tinymodels.HERMES_TEMPLATE)


def test_hermes_calls_are_split_from_the_content() -> None:
    call = '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
    text = "Checking.\n" + call + '\n<tool_call>\n{"name": "b"}'
    content, calls = parse_tool_calls(HERMES, text)
    assert content == "Checking."
    assert calls == [ToolCall("a", '{"x": 1}'), ToolCall("b", "{}")]


def test_bare_and_fenced_json_calls_parse_in_every_family() -> None:
    fenced = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
    for fmt in (HERMES, GENERIC):
        assert parse_tool_calls(fmt, fenced) == ("", [ToolCall("get_weather", '{"city": "Paris"}')])
    assert parse_tool_calls(LLAMA3, '{"name": "f", "parameters": {"a": "b"}}')[1] == [
        ToolCall("f", '{"a": "b"}')
    ]
    calls = parse_tool_calls(
        MISTRAL, '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": "{\\"k\\": 2}"}]'
    )[1]
    assert calls == [ToolCall("f", "{}"), ToolCall("g", '{"k": 2}')]


def test_a_call_in_doubled_braces_as_qwen_templates_show_it_parses() -> None:
    doubled = '{{"name": "get_weather", "arguments": {"city": "Paris"}}}'
    for fmt in (HERMES, GENERIC):
        assert parse_tool_calls(fmt, doubled) == ("", [ToolCall("get_weather", '{"city": "Paris"}')])
    assert parse_tool_calls(HERMES, "<tool_call>\n" + doubled + "\n</tool_call>")[1] == [
        ToolCall("get_weather", '{"city": "Paris"}')
    ]
    for text in ('{{"name": "f"}', "{{x}}", '{{"a": 1}}'):
        assert parse_tool_calls(HERMES, text) == (text, [])


def test_text_that_is_no_call_stays_content() -> None:
    for text in ("Paris is sunny.", '{"answer": 42}', "<tool_call>\nnot json\n</tool_call>", "[1, 2]"):
        for fmt in (HERMES, GENERIC, LLAMA3, MISTRAL):
            assert parse_tool_calls(fmt, text) == (text, [])


def _filtered(
    pieces: list[str], parallel: bool = True, names: tuple[str, ...] | None = None
) -> tuple[str, GenerationResult]:
    calls = ToolCallFilter(HERMES, parallel, names)
    streamed = "".join(calls.push(p) for p in pieces)
    result = GenerationResult("".join(pieces), (), "stop", GenerationStats())
    tail, result = calls.finish(result)
    return streamed + tail, result


def test_the_filter_streams_content_and_holds_back_calls() -> None:
    pieces = [
        "Let me",
        " check.",
        "\n<tool",
        '_call>\n{"name": ',
        '"get_time", "arguments": {}}\n</tool_call>',
    ]
    streamed, result = _filtered(pieces)
    assert streamed == "Let me check.\n"
    assert result.text == "Let me check." and result.finish_reason == "tool_calls"
    assert result.tool_calls == (ToolCall("get_time", "{}"),)


def test_the_filter_releases_what_turned_out_not_to_be_a_call() -> None:
    streamed, result = _filtered(['{"answer"', ": 42}"])
    assert streamed == '{"answer": 42}' and result.tool_calls == () and result.finish_reason == "stop"
    streamed, result = _filtered(["a <tool", " and more"])
    assert streamed == "a <tool and more"


def test_code_streams_while_json_and_fenced_json_wait() -> None:
    streamed = ToolCallFilter(HERMES, True)
    assert streamed.push("``") == "" and streamed.push("`py") == "```py"  # a fence of Python code
    assert streamed.push("thon\nx = 1") == "thon\nx = 1"
    for opening in ("{", "```json\n{", "```\n{"):
        held = ToolCallFilter(GENERIC, True)
        assert "".join(held.push(c) for c in opening + '"name": "f"') == ""


def test_a_call_repeated_word_for_word_ends_the_reply_and_counts_once() -> None:
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    time = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    calls = ToolCallFilter(HERMES, parallel=True)
    seen = []
    for piece in ["<tool", weather[5:40], weather[40:], "\n", time, "\n", weather[:30], weather[30:]]:
        calls.push(piece)
        seen.append(calls.repeated())
    # Only once the third call closes, the first again: then, and only then.
    assert seen == [False, False, False, False, False, False, False, True]
    assert calls.repeated() is False  # said once per closed call
    text = weather + "\n" + time + "\n" + weather
    _, result = calls.finish(GenerationResult(text, (), "stop", GenerationStats()))
    assert [c.name for c in result.tool_calls] == ["get_weather", "get_time"]
    assert result.finish_reason == "tool_calls"


def test_one_call_only_when_parallel_calls_are_off() -> None:
    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    _, result = _filtered([one, "\n", one], parallel=False)
    assert len(result.tool_calls) == 1


def test_a_call_to_a_tool_not_allowed_stays_text() -> None:
    # Where no grammar holds the calls to the allowed tools (markers spelled out in text), the
    # filter does: an answer calling another tool is the model's text, not a call.
    time = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    text, result = _filtered([time], names=("get_weather",))
    assert result.tool_calls == () and result.text == time and result.finish_reason == "stop"
    assert text == time
    _, allowed = _filtered([time], names=("get_weather", "get_time"))
    assert [c.name for c in allowed.tool_calls] == ["get_time"]


# --- the engine, on a tiny model that speaks Hermes ------------------------------------------


@pytest.fixture(scope="module")
def hermes_engine(tiny_dir: Path, tiny_related_draft: Path) -> Iterator[Engine]:
    target = tinymodels.write_tool_target(tiny_dir / "tiny-hermes.gguf")
    with make_engine(target, tiny_related_draft, TINY) as engine:
        yield engine


def _ask(
    engine: Engine, prompt: str, choice: ToolChoice, method: Method, max_tokens: int = 160, **kw: object
) -> GenerationResult:
    request = GenerationRequest(
        messages=(ChatMessage("user", prompt),),
        tools=(WEATHER, TIME),
        tool_choice=choice,
        max_tokens=max_tokens,  # 160: the tiny vocabulary spells <tool_call> letter by letter
        speculative=SpecParams(method, 4),
        cache_prompt=False,
        **kw,  # type: ignore[arg-type]
    )
    return engine.generate(request)


@pytest.mark.parametrize("choice", ["required", NamedTool("get_weather")], ids=["required", "named"])
def test_a_forced_call_comes_back_parsed_and_identical_for_every_method(
    hermes_engine: Engine, choice: ToolChoice
) -> None:
    for prompt in ("the cat sat on", "hello world", "what is the weather"):
        base = _ask(hermes_engine, prompt, choice, "none", parallel_tool_calls=False)
        assert base.finish_reason == "tool_calls", base
        (call,) = base.tool_calls
        assert call.name == "get_weather" or (choice == "required" and call.name == "get_time")
        if call.name == "get_weather":
            jsonschema_rs.validator_for(dict(WEATHER.parameters)).validate(json.loads(call.arguments))
        for method in ("ngram", "draft", "auto"):
            assert (
                _ask(hermes_engine, prompt, choice, method, parallel_tool_calls=False).token_ids
                == base.token_ids
            )


def test_allowed_tools_required_calls_only_those_and_is_identical_for_every_method(
    hermes_engine: Engine,
) -> None:
    for name in ("get_time", "get_weather"):
        allowed = AllowedTools((name,), "required")
        for prompt in ("the cat sat on", "what is the weather"):
            base = _ask(hermes_engine, prompt, allowed, "none")
            assert base.finish_reason == "tool_calls", base
            assert base.tool_calls and {c.name for c in base.tool_calls} == {name}
            for method in ("ngram", "draft", "auto"):
                assert _ask(hermes_engine, prompt, allowed, method).token_ids == base.token_ids
    # Every tool still reaches the prompt, so the prefix an agent resends stays cached.
    prompt_tokens = {
        _ask(hermes_engine, "hi", choice, "none").stats.prompt_tokens
        for choice in ("auto", allowed, AllowedTools(("get_weather",)))
    }
    assert len(prompt_tokens) == 1


def test_a_model_that_would_call_on_and_on_stops_at_its_first_repeat(tiny_dir: Path) -> None:
    # Held to calls with parallel calls asked for, a model that never ends on its own wrote calls
    # until max_tokens; the reply now ends where a call repeats, each kept once.
    endless = tinymodels.write_endless_tool_target(tiny_dir / "tiny-tools-endless.gguf")
    with make_engine(endless, load=TINY) as engine:
        for prompt in ("the cat sat on", "hello world"):
            base = _ask(engine, prompt, "required", "none", max_tokens=600, parallel_tool_calls=True)
            assert base.finish_reason == "tool_calls", base
            assert base.stats.tokens < 300  # two calls' worth, far from the 600 allowed
            keys = [(c.name, c.arguments) for c in base.tool_calls]
            assert keys and len(keys) == len(set(keys))
            for method in ("ngram", "auto"):
                again = _ask(engine, prompt, "required", method, max_tokens=600, parallel_tool_calls=True)
                assert again.token_ids == base.token_ids
            # Unasked, a forced call is one call: the grammar ends the reply after it.
            one = _ask(engine, prompt, "required", "none", max_tokens=600)
            assert one.finish_reason == "tool_calls" and len(one.tool_calls) == 1
            assert one.stats.tokens < base.stats.tokens
            # Where the model may call or not, several calls stay allowed unless refused.
            assert parallel_calls(None, "auto") and not parallel_calls(False, "auto")
            assert not parallel_calls(None, NamedTool("get_time")) and parallel_calls(True, "required")


def _streamed_calls(
    engine: Engine, request: GenerationRequest
) -> tuple[dict[int, list[str]], GenerationResult]:
    """Each streamed call's name and arguments joined from its pieces, by index; the result."""
    handle = engine.submit(request, stream=True)
    joined: dict[int, list[str]] = {}
    while not isinstance(event := handle.next_event(timeout=120), GenerationResult):
        assert not isinstance(event, BaseException), event
        for delta in event.calls:
            got = joined.setdefault(delta.index, ["", ""])
            assert (delta.name != "") == (got[0] == "")  # the name once, with the first piece
            got[0] += delta.name
            got[1] += delta.arguments
    return joined, event


@pytest.mark.parametrize(
    ("prompt", "tools", "calls"),
    [
        ("hello world", (WEATHER,), 3),  # three calls, then the reply ends
        ("the cat sat on", (WEATHER, TIME), 1),  # get_time, then get_time again: the repeat ends it
    ],
)
def test_parallel_calls_stream_each_under_its_index_and_end_as_streamed(
    tiny_dir: Path, prompt: str, tools: tuple[ToolSpec, ...], calls: int
) -> None:
    # The model that calls on and on, streamed: each call's pieces under its index join into the
    # call the result holds; a repeat that ended the reply was never sent; the greedy reply is the
    # one a request without streaming gets.
    endless = tinymodels.write_endless_tool_target(tiny_dir / "tiny-tools-endless.gguf")
    with make_engine(endless, load=TINY) as engine:
        request = GenerationRequest(
            messages=(ChatMessage("user", prompt),),
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=True,
            max_tokens=600,
            speculative=SpecParams("none", 4),
            cache_prompt=False,
        )
        joined, result = _streamed_calls(engine, request)
        assert len(result.tool_calls) == calls and result.finish_reason == "tool_calls"
        assert [tuple(joined[i]) for i in range(len(joined))] == [
            (c.name, c.arguments) for c in result.tool_calls
        ]
        assert result.token_ids == engine.generate(request).token_ids


def test_the_tools_reach_the_prompt(hermes_engine: Engine) -> None:
    # A call in the history and the tool list both render: the prompt grows by their tokens.
    plain = GenerationRequest(messages=(ChatMessage("user", "hi"),), max_tokens=1, cache_prompt=False)
    history = (
        ChatMessage("user", "hi"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("get_time", "{}", "call_1"),)),
        ChatMessage("tool", "noon", tool_call_id="call_1"),
    )
    with_tools = GenerationRequest(messages=history, tools=(WEATHER,), max_tokens=1, cache_prompt=False)
    n_plain = hermes_engine.generate(plain).stats.prompt_tokens
    assert hermes_engine.generate(with_tools).stats.prompt_tokens > n_plain + 40


def test_errors_are_clear(hermes_engine: Engine, tiny_target: Path) -> None:
    with pytest.raises(UserInputError, match="'nope'"):
        _ask(hermes_engine, "hi", NamedTool("nope"), "none")
    with pytest.raises(UserInputError, match="'nope'"):
        _ask(hermes_engine, "hi", AllowedTools(("get_time", "nope"), "required"), "none")
    with pytest.raises(UserInputError, match="allows no tools"):
        _ask(hermes_engine, "hi", AllowedTools(()), "none")
    with make_engine(tiny_target, load=TINY) as chatml:
        with pytest.raises(UnsupportedModelError, match="no tool support"):
            _ask(chatml, "hi", "auto", "none")
        # tool_choice none: the tools are not used, so any model serves the request.
        assert _ask(chatml, "hi", "none", "none").tool_calls == ()


@pytest.fixture(scope="module")
def tool_tokens(tiny_dir: Path) -> Path:
    """The Hermes template over a vocabulary where the markers are single special tokens, as in Qwen's."""
    extra = (tinymodels.IM_START, tinymodels.IM_END, "<tool_call>", "</tool_call>")
    vocab = tinymodels.build_vocab(extra_tokens=extra)
    path = tiny_dir / "tiny-tool-tokens.gguf"
    return tinymodels.write_tiny_model(path, vocab=vocab, chat_template=tinymodels.HERMES_TEMPLATE)


def test_in_auto_mode_an_opened_call_must_be_valid_and_its_start_is_drafted(tool_tokens: Path) -> None:
    model = LlamaModel(tool_tokens, TINY)
    try:
        request = GenerationRequest(messages=(ChatMessage("user", "hi"),), tools=(WEATHER,))
        grammar = call_grammar_for(model, HERMES, request)
        assert grammar is not None
        constraint = GrammarTokenizer(model).constraint(grammar)
        for token in model.tokenize("Let me check the weather.", add_special=False):
            constraint.accept(token)  # free text is free
        (opening,) = model.tokenize("<tool_call>", add_special=False, parse_special=True)
        constraint.accept(opening)
        # One tool: everything up to the first argument's value is forced, a free draft.
        forced = b"".join(model.piece(t) for t in constraint.forced()).decode()
        assert forced == '\n{"name": "get_weather", "arguments": {"city": "'
        assert constraint.valid_prefix(model.tokenize("Paris", add_special=False)) == 0  # the quote is forced
    finally:
        model.close()


def _reads(model: LlamaModel, grammar: str, text: str, special: bool = True) -> bool:
    """Whether `grammar` takes the whole of `text`, from the reply's start (`special`: a marker
    in it is its special token)."""
    tokens = model.tokenize(text, add_special=False, parse_special=special)
    return GrammarTokenizer(model).constraint(grammar).valid_prefix(tokens) == len(tokens)


PARIS = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
PARIS_FENCED = f"```json\n{json.dumps(json.loads(PARIS), indent=2)}\n```"  # as Qwen2.5-Coder writes it
CITIES = '{"name": "get_weather", "arguments": {"city": ["Paris", "Rome"], "unit": "c"}}'


def test_in_auto_mode_an_answer_opening_as_a_bare_call_must_be_a_valid_call(tool_tokens: Path) -> None:
    """A bare JSON answer is parsed as a call (a model that forgets its markers, as Qwen2.5-Coder
    does): where it opens as one to a tool offered, the grammar holds it to that tool's schema,
    fenced and indented as the model writes it, and ends the reply with it. Other JSON, and
    code, stay free."""
    model = LlamaModel(tool_tokens, TINY)
    try:
        request = GenerationRequest(messages=(ChatMessage("user", "hi"),), tools=(WEATHER, TIME))
        grammar = call_grammar_for(model, HERMES, request)
        assert grammar is not None
        for free in ("Let me check.", '{"a": [1, 2]}', "```python\nprint(1)\n```", '```json\n{"x": 1}\n```'):
            assert _reads(model, grammar, free), free
        for call in (PARIS, PARIS_FENCED, '{"name": "get_time", "arguments": {}}'):
            assert _reads(model, grammar, call), call
            assert parse_tool_calls(HERMES, call)[1] != []
        assert not _reads(model, grammar, CITIES)  # a city is a string: the array is refused
        assert not _reads(model, grammar, PARIS + " and then some")
        no_unit = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
        assert not _reads(model, grammar, no_unit)
    finally:
        model.close()


def test_markers_spelled_out_in_text_trigger_nothing_but_a_bare_call_is_held_all_the_same(
    tool_tokens: Path,
) -> None:
    grammar = lazy_call_grammar(HERMES, (WEATHER,), True, lambda marker: None)
    assert grammar is not None
    checked = lark_grammar(grammar, "tools")
    model = LlamaModel(tool_tokens, TINY)
    try:
        spelled = '<tool_call>\n{"name": "get_weather", "arguments": {"city": [1]}}\n</tool_call>'
        assert _reads(model, checked, spelled, special=False)  # text: markers in text are text
        assert _reads(model, checked, PARIS) and not _reads(model, checked, CITIES)
    finally:
        model.close()


@pytest.fixture(scope="module")
def mistral_tokens(tiny_dir: Path) -> Path:
    """A vocabulary where Mistral's `[TOOL_CALLS]` is a special token, as in Mistral's own."""
    vocab = tinymodels.build_vocab(extra_tokens=(tinymodels.IM_START, tinymodels.IM_END, "[TOOL_CALLS]"))
    return tinymodels.write_tiny_model(tiny_dir / "tiny-mistral-tokens.gguf", vocab=vocab)


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one"])
def test_mistral_in_auto_mode_its_calls_after_the_marker_or_as_a_bare_array_are_valid(
    mistral_tokens: Path, parallel: bool
) -> None:
    model = LlamaModel(mistral_tokens, TINY)
    try:
        special = functools.partial(single_token, model)
        lark = lazy_call_grammar(MISTRAL, (WEATHER, TIME), parallel, special)
        assert lark is not None
        grammar = lark_grammar(lark, "tools")
        two = f'[{PARIS}, {{"name": "get_time", "arguments": {{}}}}]'
        for free in ("Let me check.", "[1, 2] is a list", '[{"a": 1}]'):
            assert _reads(model, grammar, free), free
        for calls in (f"[{PARIS}]", f"[TOOL_CALLS][{PARIS}]", f"[TOOL_CALLS] [{PARIS}]"):
            assert _reads(model, grammar, calls), calls
        assert _reads(model, grammar, two) is parallel
        assert _reads(model, grammar, f"[TOOL_CALLS]{two}") is parallel
        for wrong in (f"[{CITIES}]", f"[TOOL_CALLS][{CITIES}]", f"[{PARIS}] and more", "[TOOL_CALLS] hello"):
            assert not _reads(model, grammar, wrong), wrong
        forced = lark_grammar(call_grammar(MISTRAL, (WEATHER, TIME), "required", parallel, special), "tools")
        for calls in (f"[TOOL_CALLS][{PARIS}]", f"[TOOL_CALLS] [{PARIS}]"):  # v0.3 writes the space
            assert _reads(model, forced, calls), calls
        assert not _reads(model, forced, f"[TOOL_CALLS][{CITIES}]") and not _reads(model, forced, "hello")
    finally:
        model.close()


def test_allowed_tools_in_auto_mode_an_opened_call_names_an_allowed_tool(tool_tokens: Path) -> None:
    model = LlamaModel(tool_tokens, TINY)
    try:
        request = GenerationRequest(
            messages=(ChatMessage("user", "hi"),),
            tools=(WEATHER, TIME),
            tool_choice=AllowedTools(("get_time",)),
        )
        grammar = call_grammar_for(model, HERMES, request)
        assert grammar is not None
        constraint = GrammarTokenizer(model).constraint(grammar)
        for token in model.tokenize("No call needed.", add_special=False):
            constraint.accept(token)  # the reply may still be text alone
        (opening,) = model.tokenize("<tool_call>", add_special=False, parse_special=True)
        constraint.accept(opening)
        # Of the two tools offered, only get_time may be called: its name is forced.
        forced = b"".join(model.piece(t) for t in constraint.forced()).decode()
        assert forced == '\n{"name": "get_time", "arguments": {'
    finally:
        model.close()


class _Hindsight:
    """Drafts the reply a plain run wrote, k tokens at a time: every draft is right."""

    name = "ngram"

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        pass

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        return Draft(self.tokens[len(tokens) : len(tokens) + k])


def test_a_draft_under_a_grammar_stops_where_the_grammar_forces(tool_tokens: Path) -> None:
    """The grammar drafts its forced tokens itself; a drafter's draft holds only the model's choices."""
    model = LlamaModel(tool_tokens, TINY)
    try:
        request = GenerationRequest(
            messages=(ChatMessage("user", "hi"),), tools=(WEATHER,), tool_choice="required"
        )
        grammar = call_grammar_for(model, HERMES, request)
        assert grammar is not None
        grammars = GrammarTokenizer(model)
        prompt = model.tokenize("what is the weather in the cat sat on")

        def generate(policy: FixedPolicy) -> tuple[Generation, list[tuple[int, list[int]]]]:
            gen = Generation(
                model, prompt, max_tokens=160, params=SamplingParams(), stop=(), policy=policy,
                method="ngram", k=8, constraint=grammars.constraint(grammar),
            )  # fmt: skip
            verified: list[tuple[int, list[int]]] = []
            verify = gen._verify

            def spy(draft: Draft) -> Any:
                verified.append((len(gen.tokens), list(draft.tokens)))
                return verify(draft)

            gen._verify = spy  # type: ignore[method-assign]
            list(gen.run())
            return gen, verified

        base, _ = generate(FixedPolicy(None, 0))
        assert base.result is not None
        out, verified = generate(FixedPolicy(_Hindsight(base.tokens), 8))
        assert out.result is not None and out.result.token_ids == base.result.token_ids
        # Where the grammar forces a token, along the reply.
        walk, forced = grammars.constraint(grammar), set()
        for i, token in enumerate(base.result.token_ids):
            if walk.forced():
                forced.add(len(prompt) + i)
            walk.accept(token)
        drafts = [(at, tokens) for at, tokens in verified if tokens and at not in forced]
        assert sum(len(tokens) for _, tokens in drafts) >= 4  # the drafter really drafted
        for at, tokens in drafts:
            assert not forced & set(range(at + 1, at + len(tokens))), (at, tokens)
    finally:
        model.close()


def test_auto_mode_under_its_grammar_is_identical_for_every_method(tool_tokens: Path) -> None:
    with make_engine(tool_tokens, load=TINY) as engine:
        for prompt in ("the cat sat on", "hello world"):
            base = _ask(engine, prompt, "auto", "none")
            for method in ("ngram", "layerskip"):
                assert _ask(engine, prompt, "auto", method).token_ids == base.token_ids
