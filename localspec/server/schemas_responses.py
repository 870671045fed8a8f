"""OpenAI's Responses body (`/v1/responses`) as an engine request: the same ChatMessages as chat.

A request may continue a kept response (`previous_response_id`) or a conversation's items
(`conversation`, server.response_store): they come first, then this request's input, after
this request's own instructions (OpenAI carries no instructions over). `background` is
refused by name.
Reasoning items a client sends back are skipped (this model writes none).
Function tools work as in chat: `function_call` items become an assistant turn's
calls, `function_call_output` items `tool` turns. Custom tools (input as text, free or
held to a Lark grammar or a regular expression: server.toolschemas.CustomDef) are
called as functions of one string, their `custom_tool_call` and
`custom_tool_call_output` items alike. `text.format` json_object or json_schema is
structured output. Images, files and built-in tools (web_search, file_search, ...)
are refused, each with a clear 400.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import cached_property
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from localspec.errors import UserInputError
from localspec.server.refusals import NO_VISION
from localspec.server.schemas import SpeculativeOptions, _Body, spec_params
from localspec.server.toolschemas import (
    MAX_TOOLS,
    NAME_PATTERN,
    CustomDef,
    checked_schema,
    custom_arguments,
)
from localspec.types import (
    MAX_TOP_LOGPROBS,
    AllowedTools,
    ChatMessage,
    GenerationRequest,
    NamedTool,
    SamplingParams,
    SpecParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)

# The `include` entry that asks for each output token's log-probability.
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_ITEMS_ADDED = 20  # the Conversations API's: items a conversation is created or added to with
MAX_METADATA = 16
_TEXT_PARTS = ("input_text", "output_text", "text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")


class InputItem(_Body):
    """One input item: a message (with or without `type: message`), a function or custom tool's
    call, or its output."""

    type: str = "message"
    id: str | None = None  # an output item sent back keeps its id
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[dict[str, Any]] | None = None
    # function_call and function_call_output
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    input: str | None = None  # a custom tool's call
    output: str | list[dict[str, Any]] | None = None


class FunctionTool(_Body):
    """A function the model may call; `strict` is accepted (calls forced by a grammar follow the schema)."""

    type: str
    name: str = Field(..., pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_spec(self, where: str) -> ToolSpec:
        parameters = self.parameters or {"type": "object", "properties": {}}
        return ToolSpec(self.name, self.description or "", parameters)

    def echo(self) -> dict[str, Any]:
        return {"type": "function", **self.model_dump(exclude={"type"})}


class CustomTool(CustomDef):
    """A tool whose input is text: `{"type": "custom", "name", "description", "format"}`."""

    type: Literal["custom"]

    def echo(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def _content_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            raise UserInputError(f"{where}.{i}: {NO_VISION}", param=where)
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise UserInputError(f"{where}.{i}: {kind!r} parts are not supported; send text", param=where)
        texts.append(part["text"])
    return "".join(texts)


def _add_call(turns: list[ChatMessage], item: InputItem, where: str) -> None:
    """A call joins the assistant turn before it (text and calls are one turn in chat)."""
    if not item.name:
        raise UserInputError(f"{where}: a {item.type} needs a name", param=where)
    arguments = custom_arguments(item.input or "") if item.type == "custom_tool_call" else item.arguments
    call = ToolCall(item.name, arguments or "{}", item.call_id or "")
    last = turns[-1] if turns else None
    if last is not None and last.role == "assistant":
        turns[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, call))
    else:
        turns.append(ChatMessage("assistant", "", (call,)))


def _add_item(turns: list[ChatMessage], item: InputItem, where: str, names: dict[str, str]) -> None:
    if item.type == "reasoning":
        return
    if item.type in ("function_call", "custom_tool_call"):
        _add_call(turns, item, where)
        names[item.call_id or ""] = item.name or ""
    elif item.type in ("function_call_output", "custom_tool_call_output"):
        text = _content_text(item.output, f"{where}.output")
        call_id = item.call_id or ""
        turns.append(ChatMessage("tool", text, tool_call_id=call_id, name=names.get(call_id)))
    elif item.type == "message" and item.role is not None:
        role = "system" if item.role == "developer" else item.role
        turns.append(ChatMessage(role, _content_text(item.content, f"{where}.content")))
    else:
        raise UserInputError(
            f"{where}: {item.type!r} items are not supported; send messages, function_call, "
            "custom_tool_call and their output items",
            param=where,
        )


class ResponsesBody(_Body):
    """POST /v1/responses."""

    model: str = Field(..., min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] = "auto"
    parallel_tool_calls: bool | None = None  # unset: as chat's (GenerationRequest.parallel_tool_calls)
    text: dict[str, Any] | None = None
    speculative: SpeculativeOptions | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = Field(
        None, description="Its effort goes to the chat template as `reasoning_effort` (gpt-oss's reads it)."
    )
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    truncation: Literal["auto", "disabled"] = Field(
        "disabled",
        description="auto: where the input does not fit the context, its oldest items go (the "
        "instructions and the latest kept); disabled: a clear error instead, as OpenAI's.",
    )

    def logprobs_asked(self) -> int | None:
        """Alternatives per token where `include` asks for output_text's logprobs; else None."""
        return (self.top_logprobs or 0) if LOGPROBS_INCLUDE in (self.include or ()) else None

    def template_kwargs(self) -> dict[str, Any]:
        effort = (self.reasoning or {}).get("effort")
        return {"reasoning_effort": effort} if isinstance(effort, str) else {}

    @property
    def stored(self) -> bool:
        """Whether the response is kept (OpenAI's default: unless `store: false`)."""
        return self.store is not False

    def check_supported(self) -> None:
        if self.conversation is not None and self.previous_response_id:
            raise UserInputError(
                "previous_response_id and conversation both say what came before; send one",
                param="conversation",
            )
        if self.background:
            raise UserInputError(
                "background responses are not supported; localspec answers at once", param="background"
            )

    @cached_property
    def given_tools(self) -> list[FunctionTool | CustomTool]:
        """The tools, functions and custom ones; a built-in tool (web_search, ...) is refused by its type.
        Parsed once: the request, the custom calls' items and the response's echo all read them."""
        out: list[FunctionTool | CustomTool] = []
        for i, tool in enumerate(self.tools or ()):
            kind = tool.get("type")
            if kind not in ("function", "custom"):
                raise UserInputError(
                    f"tools.{i}: {kind!r} tools are not supported; localspec serves function and "
                    "custom tools",
                    param=f"tools.{i}",
                )
            where = f"tools.{i}"
            out.append(
                _parse(FunctionTool, tool, where) if kind == "function" else _parse(CustomTool, tool, where)
            )
        return out

    def custom_names(self) -> frozenset[str]:
        """The custom tools' names: their calls go back as custom_tool_call items."""
        return frozenset(t.name for t in self.given_tools if isinstance(t, CustomTool))

    def choice(self) -> ToolChoice:
        choice = self.tool_choice
        if isinstance(choice, str):
            return choice
        if choice.get("type") == "allowed_tools":
            return _allowed_tools(choice)
        if choice.get("type") not in ("function", "custom") or not isinstance(choice.get("name"), str):
            raise UserInputError(
                'tool_choice must be "auto", "none", "required", {"type": "function", "name": ...}, '
                '{"type": "custom", "name": ...} or {"type": "allowed_tools", "mode": ..., "tools": [...]}',
                param="tool_choice",
            )
        return NamedTool(choice["name"])

    def format(self) -> dict[str, Any]:
        return (self.text or {}).get("format") or {"type": "text"}

    def output_schema(self) -> dict[str, Any] | None:
        """`text.format` as the request's JSON schema: None for text, any object for json_object."""
        fmt = self.format()
        kind = fmt.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "object"}
        if kind != "json_schema":
            raise UserInputError("text.format must be text, json_object or json_schema", param="text.format")
        if not isinstance(fmt.get("schema"), dict):
            raise UserInputError("text.format json_schema needs a schema", param="text.format.schema")
        return checked_schema(fmt["schema"], "text.format")

    def history(self, previous: tuple[ChatMessage, ...] = ()) -> tuple[ChatMessage, ...]:
        """The conversation without the instructions: the continued response's turns, then the input."""
        if isinstance(self.input, str):
            return (*previous, ChatMessage("user", self.input))
        return _turns(self.input, "input", previous)

    def chat(self, history: tuple[ChatMessage, ...] | None = None) -> tuple[ChatMessage, ...]:
        """The request's turns: its instructions, then the history (by default, the input's)."""
        head = (ChatMessage("system", self.instructions),) if self.instructions else ()
        return (*head, *(self.history() if history is None else history))

    @cached_property
    def input_items(self) -> list[dict[str, Any]]:
        """The input as items, each with an id (what GET .../input_items lists, and a conversation
        adds): made once, so both have the same ids."""
        if isinstance(self.input, str):
            return [_message_item("user", self.input)]
        return [_listed_item(item) for item in self.input]

    def conversation_id(self) -> str | None:
        """`conversation`: its id, or an object holding it."""
        given = self.conversation
        if given is None or isinstance(given, str):
            return given
        if not isinstance(given.get("id"), str):
            raise UserInputError("conversation: an id, or an object with one", param="conversation")
        return str(given["id"])


class AllowedFunction(_Body):
    type: Literal["function", "custom"]
    name: str


class FlatAllowedToolsChoice(_Body):
    """Calls to some of the tools only, in the Responses API's flat form (chat's nests them under
    `allowed_tools`): `{"type": "allowed_tools", "mode", "tools": [{"type": "function", "name"}]}`
    (hosted tools, which localspec has none of, are refused by name)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedFunction] = Field(..., max_length=MAX_TOOLS)


def _allowed_tools(choice: dict[str, Any]) -> AllowedTools:
    allowed = _parse(FlatAllowedToolsChoice, choice, "tool_choice")
    return AllowedTools(tuple(t.name for t in allowed.tools), allowed.mode)


_Parsed = TypeVar("_Parsed", bound=BaseModel)


def _parse(model: type[_Parsed], data: dict[str, Any], where: str) -> _Parsed:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join([where, *(str(p) for p in err["loc"])])
        raise UserInputError(f"invalid {param}: {err['msg']}", param=param) from None


_ITEM_PREFIXES = {
    "message": "msg_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "custom_tool_call": "ctc_",
    "custom_tool_call_output": "ctco_",
    "reasoning": "rs_",
}


def _new_id(kind: str) -> str:
    return _ITEM_PREFIXES.get(kind, "item_") + uuid.uuid4().hex[:24]


def _message_item(
    role: str, content: str | list[dict[str, Any]], item_id: str | None = None
) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    parts = [{"type": part, "text": content}] if isinstance(content, str) else content
    return {"id": item_id or _new_id("message"), "type": "message", "role": role, "content": parts}


def _listed_item(item: InputItem) -> dict[str, Any]:
    data = item.model_dump(exclude_none=True)
    item_id = data.pop("id", None)
    if item.type == "message" and item.role is not None:
        return _message_item(item.role, item.content or "", item_id)
    return {"id": item_id or _new_id(item.type), **data}


def _turns(
    items: Sequence[InputItem], where: str, previous: tuple[ChatMessage, ...] = ()
) -> tuple[ChatMessage, ...]:
    """Items as the turns after `previous`, each checked (`where` names the list they came in)."""
    turns: list[ChatMessage] = list(previous)
    # call_id -> the function's name, for the output that answers it (a call among `previous` too).
    names = {c.id: c.name for t in previous for c in t.tool_calls}
    for i, item in enumerate(items):
        _add_item(turns, item, f"{where}.{i}", names)
    return tuple(turns)


def _parsed(items: Sequence[dict[str, Any]], where: str) -> list[InputItem]:
    return [_parse(InputItem, data, f"{where}.{i}") for i, data in enumerate(items)]


def item_turns(items: Sequence[dict[str, Any]], where: str = "items") -> tuple[ChatMessage, ...]:
    """Items (a conversation's) as turns: each checked as input is."""
    return _turns(_parsed(items, where), where)


def listed_items(items: Sequence[dict[str, Any]], where: str = "items") -> list[dict[str, Any]]:
    """Items given to a conversation, each checked as input is, with ids as they are listed."""
    parsed = _parsed(items, where)
    _turns(parsed, where)
    return [_listed_item(item) for item in parsed]


class ConversationBody(_Body):
    """POST /v1/conversations, and (metadata alone) an update of one."""

    items: list[dict[str, Any]] | None = Field(None, max_length=MAX_ITEMS_ADDED)
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA)

    def checked_metadata(self) -> dict[str, str]:
        for key, value in (self.metadata or {}).items():
            if len(key) > 64 or len(value) > 512:
                raise UserInputError(
                    "metadata: keys are at most 64 characters, values at most 512", param="metadata"
                )
        return dict(self.metadata or {})


class ItemsBody(_Body):
    """POST /v1/conversations/{id}/items."""

    items: list[dict[str, Any]] = Field(..., min_length=1, max_length=MAX_ITEMS_ADDED)


def responses_request(
    body: ResponsesBody, spec: SpecParams, unlimited: int, history: tuple[ChatMessage, ...] | None = None
) -> GenerationRequest:
    """`history`: the conversation without the instructions, where the request continues a kept
    response (ResponsesBody.history); by default the input's."""
    body.check_supported()
    messages = body.chat(history)
    if not messages:
        raise UserInputError("input holds no message", param="input")
    return GenerationRequest(
        messages=messages,
        max_tokens=body.max_output_tokens or unlimited,
        sampling=SamplingParams(temperature=body.temperature, top_p=body.top_p),
        speculative=spec_params(body.speculative, spec),
        tools=tuple(t.to_spec(f"tools.{i}") for i, t in enumerate(body.given_tools)),
        tool_choice=body.choice(),
        parallel_tool_calls=body.parallel_tool_calls,
        json_schema=body.output_schema(),
        logprobs=body.logprobs_asked(),
        truncate=body.truncation == "auto",
        template_kwargs=body.template_kwargs(),
    )
