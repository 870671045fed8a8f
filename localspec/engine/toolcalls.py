"""Tool calls in a model's own syntax: which family a chat template speaks, parsing, forcing.

Pure text and JSON (no llama.cpp), so the API can ask `supports_tools(template)` of a GGUF's
template alone. Families, detected from the template text:

- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`
- llama3 (Llama 3.1+): `{"name": ..., "parameters": {...}}` (custom tools are bare JSON)
- harmony (gpt-oss): a `commentary` message to `functions.NAME` whose body is the arguments;
  engine.harmony's split writes it into the answer between `<|call|>` and `<|end|>`
- generic: a template that renders `tools` with none of those markers: a bare JSON call

Control tokens such as `[TOOL_CALLS]` and `<|python_tag|>` render as no text, so for the
families without a text marker a call is an answer that is JSON from its first character.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localspec.engine import harmony
from localspec.engine.harmony import SpecialFn, marker
from localspec.types import ToolCall, ToolChoice, ToolSpec, callable_names


@dataclass(frozen=True)
class ToolFormat:
    """How one template family writes a call. `start`/`end` wrap each call ("" for bare JSON)."""

    family: str
    start: str = ""
    end: str = ""
    args_key: str = "arguments"
    # The whole answer is one JSON array of calls (mistral) rather than one object per call.
    array: bool = False
    # An answer that is bare JSON may be a call (a model that forgets its markers); not where the
    # format keeps calls apart from the answer (harmony's own messages).
    bare: bool = True


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", array=True)
LLAMA3 = ToolFormat("llama3", args_key="parameters")
GENERIC = ToolFormat("generic")
HARMONY = ToolFormat("harmony", harmony.CALL_START, harmony.CALL_END, bare=False)

_USES_TOOLS = re.compile(r"\btools\b")


def tool_format(template: str | None) -> ToolFormat | None:
    """The tool-call family a chat template speaks, or None when it has no tool support."""
    if not template or not _USES_TOOLS.search(template):
        return None
    if harmony.harmony(template):
        return HARMONY
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "<|start_header_id|>" in template:
        return LLAMA3
    return GENERIC


def supports_tools(template: str | None) -> bool:
    """Whether a model with this chat template can be given tools (Ollama's `tools` capability)."""
    return tool_format(template) is not None


# --- parsing -------------------------------------------------------------------------


def parse_tool_calls(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """Split a model's answer into its content and the calls it wrote (none if it wrote none)."""
    if fmt.start and fmt.end:
        content, calls = _parse_wrapped(fmt, text)
        if calls or not fmt.bare:
            return content, calls
    body = _unfence(text.strip().removeprefix(fmt.start).strip())
    calls = _calls_from_json(fmt, body)
    return ("", calls) if calls else (text, [])


def _parse_wrapped(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    pattern = re.escape(fmt.start) + r"(.*?)(?:" + re.escape(fmt.end) + r"|$)"
    calls: list[ToolCall] = []
    for body in re.findall(pattern, text, flags=re.DOTALL):
        calls.extend(_calls_from_json(fmt, body.strip()))
    if not calls:
        return text, []
    content = re.sub(pattern, "", text, flags=re.DOTALL)
    return content.strip(), calls


def _unfence(text: str) -> str:
    """Models often wrap JSON in a Markdown code fence."""
    match = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.DOTALL)
    return match.group(1) if match else text


# Qwen2.5's template shows the call format to the model as `{{"name": ..., "arguments": ...}}` (a
# Jinja escape left literal), and Qwen2.5-Coder 1.5B copies it: after a tool's result it writes
# `{{"name": "get_weather", "arguments": {"city": "Paris"}}}`. One doubled outer brace is undone.
_DOUBLED = re.compile(r"\{(\{.*\})\}", flags=re.DOTALL)


def _call_json(body: str) -> Any:
    """The JSON value of a call's text, once more without a doubled outer brace; ValueError if neither."""
    try:
        return json.loads(body)
    except ValueError:
        doubled = _DOUBLED.fullmatch(body)
        if doubled is None:
            raise
        return json.loads(doubled.group(1))


def _calls_from_json(fmt: ToolFormat, body: str) -> list[ToolCall]:
    try:
        data = _call_json(body)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    calls = [_call(fmt, item) for item in items]
    return [c for c in calls if c is not None] if all(c is not None for c in calls) else []


def _call(fmt: ToolFormat, item: Any) -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = item.get(fmt.args_key, item.get("arguments", item.get("parameters")))
    if args is None:
        args = {}
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(item["name"], json.dumps(args, ensure_ascii=False))


# --- forcing a call ------------------------------------------------------------------


def call_grammar(
    fmt: ToolFormat,
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    parallel: bool,
    special: SpecialFn,
    budget: int | None = None,
) -> str:
    """A Lark grammar (llguidance's dialect) whose every sentence is a valid call in `fmt`
    (harmony's after the analysis, within `budget` tokens where there is one)."""
    if fmt is HARMONY:
        return _harmony_call(tools, choice, special, budget)
    one = _one_call(fmt, tools, choice)
    if fmt.array:
        array = {"type": "array", "items": one, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        # Mistral v0.3's template writes `[TOOL_CALLS] [`: the model may space it so.
        return f"start: {marker(fmt.start, special)} WS? {_json(array)}\nWS: /\\s+/\n"
    call = f"{marker(fmt.start, special)} " if fmt.start else ""
    if fmt.end:
        call += f'"\\n" {_json(one)} "\\n" {marker(fmt.end, special)}'
    else:
        call += _json(one)
    repeat = ' ("\\n" call)*' if parallel and fmt.end else ""
    return f"start: call{repeat}\ncall: {call}\n"


def lazy_call_grammar(
    fmt: ToolFormat,
    tools: Sequence[ToolSpec],
    parallel: bool,
    special: SpecialFn,
    budget: int | None = None,
) -> str | None:
    """For tool_choice auto: free text, but once the model opens a call, a valid call to the end.

    A call opens in two ways. After the format's marker, where both markers are single special
    tokens, which free text can never contain: then the opening token is the trigger, and what
    follows it is forced as far as the schemas go (with one tool, `{"name": "get_weather",
    "arguments": {"` is a free draft). And, in a format whose bare JSON answer is a call
    (`bare`: a model that forgets its markers, as Qwen2.5-Coder does), where the answer opens as
    a call to one of the tools (`{"name": "get_weather"`, fenced or not, as llama.cpp's pattern
    trigger does): the rest of it is then forced to a valid call too, where it was parsed as
    written, arguments against the schema or not. An answer that is other JSON stays free.
    Mistral's answer is its marker's array of calls: `_lazy_array`. None where nothing applies.
    Harmony's call opens with a header's text (`to=functions.`),
    watched in headers alone; its analysis within `budget` tokens where there is one (a thinking
    model's is bounded around this grammar: reasoning.thinking_first).
    """
    if fmt is HARMONY:
        return harmony.lazy_calls({t.name: _harmony_arguments(t) for t in tools}, special, budget)
    if fmt.array:
        return _lazy_array(fmt, tools, parallel, special)
    wrapped = bool(fmt.start and fmt.end) and special(fmt.start) is not None and special(fmt.end) is not None
    bare = fmt.bare
    if not (wrapped or bare):
        return None
    rules = _bare_rules(fmt, tools) if bare else ""
    if not wrapped:
        return f"start: FREE? | bare\n{rules}"
    rules += "TEXT: /(.|\\n)+/\n"
    answer = "FREE?" if bare else "TEXT?"
    one = _json(_one_call(fmt, tools, "auto"))
    call = f'{marker(fmt.start, special)} "\\n" {one} "\\n" {marker(fmt.end, special)}'
    calls = "*" if parallel else "?"
    start = f"{answer} (call TEXT?){calls}" + (" | bare" if bare else "")
    return f"start: {start}\ncall: {call}\n{rules}"


def _bare_rules(fmt: ToolFormat, tools: Sequence[ToolSpec]) -> str:
    """`FREE`, any answer but one opening as a call (`{"name": "get_weather"`, fenced or not), and
    `bare`, such a call written whole and valid, spaced as the model spaces it (Qwen2.5-Coder
    writes it fenced and indented). Each call's head up to its arguments is one lexeme, as FREE
    is: llguidance's lexer takes the longest match and does not go back, so the two must part
    where FREE ends, inside the head (a JSON grammar's first brace beside FREE would be passed
    over, and the call refused)."""
    rules = [_free(tools, "(```(json)?\\s*)?"), "END: /\\s*\\}\\s*/", "FENCE_END: /```\\s*/"]
    calls = []
    for i, tool in enumerate(tools):
        head, arguments = _call_head(fmt, tool), _spaced_arguments(tool)
        rules += [f"HEAD{i}: /\\s*{head}/", f"FENCED{i}: /\\s*```(json)?\\s*{head}/"]
        calls += [f"HEAD{i} {arguments} END", f"FENCED{i} {arguments} END FENCE_END"]
    return "\n".join([*rules, "bare: " + " | ".join(calls)]) + "\n"


def _lazy_array(fmt: ToolFormat, tools: Sequence[ToolSpec], parallel: bool, special: SpecialFn) -> str:
    """Mistral's auto mode: free text, or its marker and then a valid array of calls (where the
    marker is a special token, as free text cannot hold it), or an answer opening as that array
    without the marker (`[{"name": "get_weather"`), held to the schemas from there as `_bare_rules`
    holds a bare call."""
    rules = [_free(tools, "\\[\\s*"), "END: /\\s*\\}/", "CLOSE: /\\s*\\]\\s*/"]
    first, more = [], []
    for i, tool in enumerate(tools):
        head, arguments = _call_head(fmt, tool), _spaced_arguments(tool)
        rules += [f"HEAD{i}: /\\s*\\[\\s*{head}/", f"NEXT{i}: /\\s*,\\s*{head}/"]
        first.append(f"HEAD{i} {arguments} END")
        more.append(f"NEXT{i} {arguments} END")
    rules += [
        "bare: (" + " | ".join(first) + ")" + (" (" + " | ".join(more) + ")*" if parallel else "") + " CLOSE"
    ]
    start = "FREE? | bare"
    if special(fmt.start) is not None:
        one = _one_call(fmt, tools, "auto")
        array = {"type": "array", "items": one, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        start += f" | {marker(fmt.start, special)} WS? {_json(array)}"  # spaced as in call_grammar
        rules.append("WS: /\\s+/")
    return f"start: {start}\n" + "\n".join(rules) + "\n"


def _free(tools: Sequence[ToolSpec], before: str) -> str:
    """The free answer: any text but one opening (after `before`, a regex) as a call to a tool."""
    names = "|".join(_regex_escape(t.name) for t in tools)
    return f'FREE: /(.|\\n)+/ & ~/\\s*{before}\\{{\\s*"name"\\s*:\\s*"({names})"(.|\\n)*/'


def _call_head(fmt: ToolFormat, tool: ToolSpec) -> str:
    """A regex for a call's JSON up to its arguments, spaced any way: `{"name": "x", "arguments": `."""
    name = _regex_escape(json.dumps(tool.name))
    return f'\\{{\\s*"name"\\s*:\\s*{name}\\s*,\\s*"{fmt.args_key}"\\s*:\\s*'


def _spaced_arguments(tool: ToolSpec) -> str:
    from localspec.engine.constraint import SPACED_JSON_OPTIONS

    return _json({**tool.arguments_schema(), "x-guidance": SPACED_JSON_OPTIONS})


# Characters a Rust regex (llguidance's) gives a meaning; a tool's name is matched as written.
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~/")


def _regex_escape(text: str) -> str:
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


def _harmony_call(
    tools: Sequence[ToolSpec], choice: ToolChoice, special: SpecialFn, budget: int | None
) -> str:
    """gpt-oss's call (one a reply: `<|call|>` ends it), after the analysis it may write first."""
    calls = " | ".join(
        harmony.message_opening(f"commentary to=functions.{t.name}", special) + " " + _harmony_arguments(t)
        for t in callable_tools(tools, choice)
    )
    return harmony.forced_reply(f"({calls})", special, budget=budget)


def _harmony_arguments(tool: ToolSpec) -> str:
    """A harmony call's body: the tool's arguments alone (its name is in the header), compact or
    spaced (constraint.HARMONY_JSON_OPTIONS)."""
    from localspec.engine.constraint import HARMONY_JSON_OPTIONS

    params = tool.arguments_schema()
    return _json({**params, "x-guidance": HARMONY_JSON_OPTIONS})


def _one_call(fmt: ToolFormat, tools: Sequence[ToolSpec], choice: ToolChoice) -> dict[str, Any]:
    from localspec.engine.constraint import JSON_OPTIONS

    calls = [_call_schema(fmt, t) for t in callable_tools(tools, choice)]
    return {"anyOf": calls, "x-guidance": JSON_OPTIONS}


def _call_schema(fmt: ToolFormat, tool: ToolSpec) -> dict[str, Any]:
    params = tool.arguments_schema()
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, fmt.args_key: params},
        "required": ["name", fmt.args_key],
        "additionalProperties": False,
    }


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(schema)


def callable_tools(tools: Sequence[ToolSpec], choice: ToolChoice) -> list[ToolSpec]:
    """The tools a call may name: those the choice names (named, allowed_tools), or all of them."""
    names = callable_names(choice)
    return [t for t in tools if names is None or t.name in names]


def named_tool_missing(tools: Sequence[ToolSpec], choice: ToolChoice) -> str | None:
    """A name a tool_choice asks for (named, allowed_tools) that no tool has."""
    have = {t.name for t in tools}
    return next((name for name in callable_names(choice) or () if name not in have), None)
