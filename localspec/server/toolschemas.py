"""Request bodies for tool calling and structured output, in OpenAI's and Ollama's shapes.

OpenAI and Ollama describe a tool the same way (`{"type": "function", "function": {name,
description, parameters}}`); they differ in how a call's arguments travel: OpenAI as JSON
text, Ollama as a JSON object. Schemas are checked here, before a request is queued, so a
bad one is a 400 in the API's own shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from localspec.engine.callstream import FieldText
from localspec.engine.constraint import choice_lark, gbnf_lark, json_schema_grammar, regex_lark
from localspec.errors import UserInputError
from localspec.types import AllowedTools, NamedTool, ToolCall, ToolChoice, ToolSpec

# OpenAI's rule for function names; also keeps names safe inside a grammar and a template.
NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
MAX_TOOLS = 128


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class FunctionDef(_Body):
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Tool(_Body):
    """A function the model may call (OpenAI's and Ollama's shape)."""

    type: Literal["function"] = "function"
    function: FunctionDef

    def to_spec(self, where: str = "tools") -> ToolSpec:
        f = self.function
        return ToolSpec(f.name, f.description, f.parameters)


# --- custom tools: input as text, not JSON -----------------------------------------------------
# OpenAI's custom tools (`{"type": "custom", "name", "description", "format"}`: the Responses API's
# shape, chat's nests it under `custom`) take their input as text, free or held to a grammar (Lark
# or a regular expression; Codex's apply_patch is one). The model sees a function whose one
# parameter is that text, and writes the call as it writes any; the grammar, where there is one,
# holds the call's string as its pattern (engine.lark_regex), and the reply gives the text back
# as a custom tool call.
CUSTOM_INPUT = "input"
_CUSTOM_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {CUSTOM_INPUT: {"type": "string"}},
    "required": [CUSTOM_INPUT],
    "additionalProperties": False,
}


class CustomGrammar(_Body):
    """The grammar of a chat completion's custom tool: `{"syntax", "definition"}`."""

    syntax: Literal["lark", "regex"]
    definition: str


class CustomFormat(_Body):
    """A custom tool's input: free text, or text a grammar holds (`syntax` lark or regex), given
    beside `type` (the Responses API's shape) or under `grammar` (chat completions')."""

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None
    grammar: CustomGrammar | None = None

    def held(self, where: str) -> tuple[str, str, str]:
        """The grammar's syntax, its definition and the field it came in."""
        if self.grammar is not None:
            return self.grammar.syntax, self.grammar.definition, f"{where}.grammar.definition"
        if self.syntax is None or not self.definition:
            raise UserInputError(f"{where}: a grammar needs its syntax and definition", param=where)
        return self.syntax, self.definition, f"{where}.definition"


class CustomDef(_Body):
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str | None = None
    format: CustomFormat | None = None

    def to_spec(self, where: str) -> ToolSpec:
        fmt = self.format
        description = self.description or ""
        if fmt is None or fmt.type == "text":
            return ToolSpec(self.name, description, _CUSTOM_PARAMETERS)
        syntax, definition, field = fmt.held(f"{where}.format")
        pattern = _custom_pattern(syntax, definition, field)
        shown = "a regular expression" if syntax == "regex" else "a Lark grammar"
        described = f"{description}\n\nThe input is text that {shown} holds:\n{definition}".lstrip()
        held = {**_CUSTOM_PARAMETERS, "properties": {CUSTOM_INPUT: {"type": "string", "pattern": pattern}}}
        return ToolSpec(self.name, described, _CUSTOM_PARAMETERS, held_to=held)


def _custom_pattern(syntax: str, definition: str, where: str) -> str:
    """The grammar as the pattern of a JSON string (llguidance unescapes the string to match it),
    anchored, checked."""
    from localspec.engine.lark_regex import lark_regex

    pattern = lark_regex(definition, where) if syntax == "lark" else f"^(?:{definition})$"
    json_schema_grammar({"type": "string", "pattern": pattern}, where)
    return pattern


def custom_input(arguments: str) -> str:
    """A custom tool's input from its call's arguments (the text itself where they are not the
    object the tool's parameters describe: a model no grammar held; the start of the input where
    the token limit cut the call short)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        field = FieldText(CUSTOM_INPUT)
        started = field.feed(arguments)
        return started if arguments.startswith(field.head) else arguments
    text = args.get(CUSTOM_INPUT) if isinstance(args, dict) else None
    return text if isinstance(text, str) else arguments


def custom_arguments(text: str) -> str:
    """A custom tool's input (a client sends its earlier calls back) as the call's arguments."""
    return json.dumps({CUSTOM_INPUT: text})


class ChatTool(_Body):
    """A chat completion's tool: a function, or a custom tool (`{"type": "custom", "custom": {...}}`)."""

    type: Literal["function", "custom"] = "function"
    function: FunctionDef | None = None
    custom: CustomDef | None = None

    def to_spec(self, where: str = "tools") -> ToolSpec:
        if self.type == "custom":
            if self.custom is None:
                raise UserInputError(f"{where}: a custom tool needs `custom`", param=f"{where}.custom")
            return self.custom.to_spec(f"{where}.custom")
        if self.function is None:
            raise UserInputError(f"{where}: a function tool needs `function`", param=f"{where}.function")
        return Tool(function=self.function).to_spec(where)


def custom_names(tools: list[ChatTool] | None) -> frozenset[str]:
    """The custom tools' names: their calls go back as custom calls (their input the text)."""
    return frozenset(t.custom.name for t in tools or () if t.type == "custom" and t.custom is not None)


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: FunctionName


class NamedCustomChoice(_Body):
    """A call to one custom tool: `{"type": "custom", "custom": {"name"}}`."""

    type: Literal["custom"]
    custom: FunctionName


class AllowedTool(_Body):
    type: Literal["function", "custom"] = "function"
    function: FunctionName | None = None
    custom: FunctionName | None = None

    def name(self, where: str) -> str:
        named = self.custom if self.type == "custom" else self.function
        if named is None:
            raise UserInputError(f"{where}: a {self.type} entry needs `{self.type}`", param=where)
        return named.name


class AllowedToolSet(_Body):
    mode: Literal["auto", "required"]
    tools: list[AllowedTool] = Field(..., max_length=MAX_TOOLS)


class AllowedToolsChoice(_Body):
    """Calls to some of the tools only (`{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedToolSet


OpenAIToolChoice = (
    Literal["none", "auto", "required"] | NamedToolChoice | NamedCustomChoice | AllowedToolsChoice
)


def tool_specs(tools: Sequence[Tool | ChatTool] | None) -> tuple[ToolSpec, ...]:
    if tools is not None and len(tools) > MAX_TOOLS:
        raise UserInputError(f"at most {MAX_TOOLS} tools per request", param="tools")
    return tuple(t.to_spec(f"tools.{i}") for i, t in enumerate(tools or ()))


def tool_choice(choice: OpenAIToolChoice | None) -> ToolChoice:
    if choice is None:
        return "auto"
    if isinstance(choice, AllowedToolsChoice):
        allowed = choice.allowed_tools
        where = "tool_choice.allowed_tools.tools"
        return AllowedTools(tuple(t.name(f"{where}.{i}") for i, t in enumerate(allowed.tools)), allowed.mode)
    if isinstance(choice, NamedCustomChoice):
        return NamedTool(choice.custom.name)
    return NamedTool(choice.function.name) if isinstance(choice, NamedToolChoice) else choice


# --- calls in history ------------------------------------------------------------------------


class CallFunction(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class CustomCall(_Body):
    name: str
    input: str = ""


class OpenAIToolCall(_Body):
    """An assistant's earlier call, as the client sends it back: a function's arguments are JSON
    text; a custom tool's input is the text itself (`{"type": "custom", "custom": {name, input}}`)."""

    id: str = ""
    type: Literal["function", "custom"] = "function"
    function: CallFunction | None = None
    custom: CustomCall | None = None

    def to_call(self) -> ToolCall:
        if self.type == "custom" and self.custom is not None:
            return ToolCall(self.custom.name, custom_arguments(self.custom.input), self.id)
        if self.function is None:
            raise UserInputError(
                f"a {self.type} tool call needs `{self.type}` (its name and "
                + ("input)" if self.type == "custom" else "arguments)"),
                param="tool_calls",
            )
        args = self.function.arguments
        return ToolCall(self.function.name, args if isinstance(args, str) else json.dumps(args), self.id)


def openai_tool_calls(
    calls: list[ToolCall], ids: list[str], custom: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """Calls as OpenAI returns them, each with an id: a function's arguments as JSON text, a custom
    tool's (named in `custom`) input as its text."""
    return [
        {"id": call_id, "type": "custom", "custom": {"name": c.name, "input": custom_input(c.arguments)}}
        if c.name in custom
        else {"id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c, call_id in zip(calls, ids, strict=True)
    ]


def ollama_tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Calls as Ollama returns them: arguments as a JSON object."""
    return [{"function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")}} for c in calls]


# --- structured output ------------------------------------------------------------------------

ANY_OBJECT: dict[str, Any] = {"type": "object"}


class JsonSchemaFormat(_Body):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's response_format: text, any JSON object, or JSON valid against a schema; llama-server
    also reads a `schema` beside json_object."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    def output_schema(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return checked_schema(self.schema_, "response_format.schema") if self.schema_ else ANY_OBJECT
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise UserInputError(
                "response_format json_schema needs json_schema.schema", param="response_format"
            )
        return checked_schema(self.json_schema.schema_, "response_format")


# What a field asks the reply to follow: its name, then a JSON schema or a Lark grammar.
Asked = tuple[str, dict[str, Any] | None, str | None]


class StructuredOutputs(_Body):
    """vLLM's structured_outputs: one of these."""

    json_: dict[str, Any] | str | None = Field(
        None, alias="json", description="JSON valid against this schema."
    )
    json_object: bool | None = Field(None, description="Any JSON object.")
    regex: str | None = Field(None, description="Text the whole reply matches.")
    choice: list[str] | None = Field(None, description="One of these texts, exactly.")
    grammar: str | None = Field(None, description="A GBNF (or Lark) grammar the reply follows.")

    def asked(self) -> list[Asked]:
        found = [
            _json_asked("structured_outputs.json", self.json_),
            ("structured_outputs.json_object", ANY_OBJECT, None) if self.json_object else None,
            _grammar_asked("structured_outputs.regex", self.regex, regex_lark),
            _choice_asked("structured_outputs.choice", self.choice),
            _grammar_asked("structured_outputs.grammar", self.grammar, gbnf_lark),
        ]
        return [a for a in found if a is not None]


class OutputConstraints(_Body):
    """The other ways clients hold a reply to a form: llama-server's `grammar` and `json_schema`
    (its own clients and docs), vLLM's guided_* fields and structured_outputs (sent through the
    openai package's extra_body). Each one, where given, is enforced as response_format is."""

    grammar: str | None = Field(
        None, description="llama.cpp extension: a GBNF grammar the reply follows (Lark is read too)."
    )
    json_schema: dict[str, Any] | None = Field(
        None, description="llama.cpp extension: JSON valid against this schema; {} is any JSON object."
    )
    guided_json: dict[str, Any] | str | None = Field(
        None, description="vLLM: JSON valid against this schema."
    )
    guided_regex: str | None = Field(None, description="vLLM: text the whole reply matches.")
    guided_choice: list[str] | None = Field(None, description="vLLM: one of these texts, exactly.")
    guided_grammar: str | None = Field(None, description="vLLM: a GBNF grammar the reply follows.")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM: one of json, json_object, regex, choice, grammar."
    )

    def constraint(
        self, schema: dict[str, Any] | None = None, schema_param: str = "response_format"
    ) -> tuple[dict[str, Any] | None, str | None]:
        """The reply's JSON schema or grammar (GenerationRequest.json_schema, .grammar): at most one
        of these fields, and of `schema` (response_format's) beside them; each checked."""
        found: list[Asked | None] = [
            (schema_param, schema, None) if schema is not None else None,
            # llama-server: an empty schema is any object.
            _json_asked("json_schema", ANY_OBJECT if self.json_schema == {} else self.json_schema),
            _grammar_asked("grammar", self.grammar, gbnf_lark),
            _json_asked("guided_json", self.guided_json),
            _grammar_asked("guided_regex", self.guided_regex, regex_lark),
            _choice_asked("guided_choice", self.guided_choice),
            _grammar_asked("guided_grammar", self.guided_grammar, gbnf_lark),
            *(self.structured_outputs.asked() if self.structured_outputs else ()),
        ]
        asked = [a for a in found if a is not None]
        if len(asked) > 1:
            first, second = asked[0][0], asked[1][0]
            raise UserInputError(
                f"{first} and {second} both hold the reply to a form; send one", param=second
            )
        return (asked[0][1], asked[0][2]) if asked else (None, None)


def _json_asked(param: str, schema: dict[str, Any] | str | None) -> Asked | None:
    if schema is None:
        return None
    if isinstance(schema, str):  # vLLM takes the schema as JSON text too
        try:
            schema = json.loads(schema)
        except ValueError:
            raise UserInputError(f"{param}: not a JSON schema (nor JSON text of one)", param=param) from None
        if not isinstance(schema, dict):
            raise UserInputError(f"{param}: a JSON schema is an object", param=param)
    return param, checked_schema(schema, param), None


def _grammar_asked(param: str, text: str | None, convert: Callable[[str, str], str]) -> Asked | None:
    return (param, None, convert(text, param)) if text else None


def _choice_asked(param: str, choices: list[str] | None) -> Asked | None:
    return (param, None, choice_lark(choices, param)) if choices is not None else None


def ollama_format_schema(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON schema; "" or absent is free text."""
    if not fmt:
        return None
    if fmt == "json":
        return {"type": "object"}
    if isinstance(fmt, str):
        raise UserInputError(f'format must be "json" or a JSON schema, not {fmt!r}', param="format")
    return checked_schema(fmt, "format")


def checked_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    json_schema_grammar(schema, param)  # raises UserInputError naming `param`
    return schema
