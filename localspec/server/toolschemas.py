"""Request bodies for tool calling and structured output, in OpenAI's and Ollama's shapes.

OpenAI and Ollama describe a tool the same way (`{"type": "function", "function": {name,
description, parameters}}`); they differ in how a call's arguments travel: OpenAI as JSON
text, Ollama as a JSON object. Schemas are checked here, before a request is queued, so a
bad one is a 400 in the API's own shape.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from localspec.engine.constraint import json_schema_grammar
from localspec.errors import UserInputError
from localspec.types import NamedTool, ToolCall, ToolChoice, ToolSpec

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

    def to_spec(self) -> ToolSpec:
        f = self.function
        return ToolSpec(f.name, f.description, f.parameters)


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: FunctionName


OpenAIToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def tool_specs(tools: list[Tool] | None) -> tuple[ToolSpec, ...]:
    if tools is not None and len(tools) > MAX_TOOLS:
        raise UserInputError(f"at most {MAX_TOOLS} tools per request", param="tools")
    return tuple(t.to_spec() for t in tools or ())


def tool_choice(choice: OpenAIToolChoice | None) -> ToolChoice:
    if choice is None:
        return "auto"
    return NamedTool(choice.function.name) if isinstance(choice, NamedToolChoice) else choice


# --- calls in history ------------------------------------------------------------------------


class CallFunction(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class OpenAIToolCall(_Body):
    """An assistant's earlier call, as the client sends it back: arguments are JSON text."""

    id: str = ""
    type: Literal["function"] = "function"
    function: CallFunction

    def to_call(self) -> ToolCall:
        args = self.function.arguments
        return ToolCall(self.function.name, args if isinstance(args, str) else json.dumps(args), self.id)


def openai_tool_calls(calls: list[ToolCall], ids: list[str]) -> list[dict[str, Any]]:
    """Calls as OpenAI returns them: arguments as JSON text, each with an id."""
    return [
        {"id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c, call_id in zip(calls, ids, strict=True)
    ]


def ollama_tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Calls as Ollama returns them: arguments as a JSON object."""
    return [{"function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")}} for c in calls]


# --- structured output ------------------------------------------------------------------------


class JsonSchemaFormat(_Body):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's response_format: text, any JSON object, or JSON valid against a schema."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None

    def output_schema(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "object"}
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise UserInputError(
                "response_format json_schema needs json_schema.schema", param="response_format"
            )
        return checked_schema(self.json_schema.schema_, "response_format")


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
