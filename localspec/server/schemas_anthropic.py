"""Anthropic's Messages body (`/v1/messages`: Claude Code, the `anthropic` SDK) as an engine request.

It becomes the same `GenerationRequest` of `ChatMessage`s that OpenAI's chat does. Text blocks
are joined by a blank line; an assistant's `tool_use` blocks become its `tool_calls`, a user's
`tool_result` blocks `tool` turns (before the user's text, as Anthropic orders them). Blocks
this daemon cannot serve (images, documents, server tools) are refused by name rather than
dropped. A thinking model's reasoning goes out in `thinking` blocks and comes back from them
(the template decides whether an earlier turn's is shown); `redacted_thinking` blocks are
skipped, `thinking` (the request's setting) asks the template for reasoning or not
(`enable_thinking`), and `cache_control` and `metadata` are accepted and ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from localspec.errors import UserInputError
from localspec.server.refusals import NO_VISION
from localspec.server.schemas import MAX_STOP, SpeculativeOptions, _Body, spec_params, stop_strings
from localspec.server.toolschemas import MAX_TOOLS, NAME_PATTERN, checked_schema
from localspec.types import (
    ChatMessage,
    GenerationRequest,
    NamedTool,
    SamplingParams,
    SpecParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)

_SKIPPED = ("redacted_thinking",)


class ContentBlock(_Body):
    """One block of a message or system prompt: text, a tool_use, or a tool_result."""

    type: str
    text: str | None = None
    thinking: str | None = None  # a thinking block's
    # tool_use
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool = False


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class AnthropicTool(_Body):
    """A custom tool; Anthropic's typed tools (web_search_..., bash_..., computer_...) are refused."""

    name: str = Field(..., pattern=NAME_PATTERN)
    description: str = ""
    input_schema: dict[str, Any] | None = None  # required of custom tools; typed tools have none
    type: str | None = None

    def to_spec(self, where: str) -> ToolSpec:
        if self.type not in (None, "custom"):
            raise UserInputError(
                f"{where}: {self.type!r} tools are not supported; localspec serves custom tools "
                "(name, description, input_schema)",
                param=where,
            )
        if self.input_schema is None:
            raise UserInputError(f"{where}.input_schema: field required", param=f"{where}.input_schema")
        return ToolSpec(self.name, self.description, self.input_schema)


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    def to_choice(self) -> ToolChoice:
        if self.type == "tool":
            if not self.name:
                raise UserInputError("tool_choice {type: tool} needs a name", param="tool_choice.name")
            return NamedTool(self.name)
        return "required" if self.type == "any" else self.type


def block_text(content: str | list[ContentBlock], where: str) -> str:
    """The text of a content field; a block that is not text is a clear error."""
    if isinstance(content, str):
        return content
    return "\n\n".join(_text(block, f"{where}.content.{i}") for i, block in enumerate(content))


def _text(block: ContentBlock, where: str) -> str:
    if block.type in ("image", "document"):
        raise UserInputError(f"{where}: {NO_VISION}", param=where)
    if block.type != "text" or block.text is None:
        raise UserInputError(f"{where}: {block.type!r} blocks are not supported here; send text", param=where)
    return block.text


def _assistant(content: str | list[ContentBlock], where: str) -> ChatMessage:
    if isinstance(content, str):
        return ChatMessage("assistant", content)
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        if block.type == "tool_use":
            if not block.name:
                raise UserInputError(f"{where}.content.{i}: tool_use needs a name", param=where)
            calls.append(ToolCall(block.name, json.dumps(block.input or {}), block.id or ""))
        elif block.type == "thinking":
            thoughts.append(block.thinking or "")
        elif block.type not in _SKIPPED:
            texts.append(_text(block, f"{where}.content.{i}"))
    return ChatMessage("assistant", "\n\n".join(texts), tuple(calls), reasoning="\n\n".join(thoughts))


def _user(content: str | list[ContentBlock], where: str, names: dict[str, str]) -> list[ChatMessage]:
    """A user turn: a `tool` turn per tool_result, then the user's text, if any."""
    if isinstance(content, str):
        return [ChatMessage("user", content)]
    results: list[ChatMessage] = []
    texts: list[str] = []
    for i, block in enumerate(content):
        at = f"{where}.content.{i}"
        if block.type == "tool_result":
            text = block_text(block.content or "", at)
            # The template has no error flag; the model reads that the call failed.
            text = f"Error: {text}" if block.is_error else text
            call_id = block.tool_use_id or ""
            results.append(ChatMessage("tool", text, tool_call_id=call_id, name=names.get(call_id)))
        else:
            texts.append(_text(block, at))
    return results + ([ChatMessage("user", "\n\n".join(texts))] if texts else [])


def _turns(messages: list[AnthropicMessage]) -> tuple[ChatMessage, ...]:
    names: dict[str, str] = {}  # tool_use id -> the tool's name, for the tool_result that answers it
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        if m.role == "assistant":
            turn = _assistant(m.content, f"messages.{i}")
            names.update((c.id, c.name) for c in turn.tool_calls if c.id)
            out.append(turn)
        else:
            out.extend(_user(m.content, f"messages.{i}", names))
    return tuple(out)


class OutputFormat(_Body):
    """Anthropic's structured outputs: the reply is JSON valid against `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(..., alias="schema")


class OutputConfig(_Body):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="Reaches the chat template as reasoning_effort (gpt-oss's): xhigh and max as high."
    )


class _AnthropicBase(_Body):
    model: str = Field(..., min_length=1)
    messages: list[AnthropicMessage] = Field(..., min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[AnthropicTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict[str, Any] | None = Field(
        None,
        description='{"type": "enabled"} or "disabled" asks a thinking model\'s template for reasoning '
        "or not (enable_thinking); budget_tokens bounds it. Reasoning goes out in thinking blocks.",
    )
    # Claude Code sends it; there is nothing to bill.
    metadata: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    output_config: OutputConfig | None = Field(None, description="format: the reply as JSON of a schema.")
    output_format: OutputFormat | None = Field(None, description="output_config.format's name in the beta.")

    def template_kwargs(self) -> dict[str, Any]:
        kind = (self.thinking or {}).get("type")
        kwargs = {"enable_thinking": kind == "enabled"} if kind in ("enabled", "disabled") else {}
        effort = self.output_config.effort if self.output_config else None
        if effort is not None:
            kwargs["reasoning_effort"] = effort if effort in ("low", "medium", "high") else "high"
        return kwargs

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the reply follows (structured outputs), checked; None: free text."""
        given = self.output_config.format if self.output_config else None
        if given is not None and self.output_format is not None:
            raise UserInputError(
                "output_config.format and output_format both give the reply's form; send one",
                param="output_format",
            )
        if given is not None:
            return checked_schema(given.schema_, "output_config.format")
        if self.output_format is not None:
            return checked_schema(self.output_format.schema_, "output_format")
        return None

    def thinking_budget(self) -> int | None:
        """budget_tokens where thinking is enabled: the reasoning's bound (engine.reasoning)."""
        thinking = self.thinking or {}
        budget = thinking.get("budget_tokens")
        if thinking.get("type") != "enabled" or budget is None:
            return None
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise UserInputError("thinking.budget_tokens must be a whole number of tokens", param="thinking")
        return budget

    def chat(self) -> tuple[ChatMessage, ...]:
        system = block_text(self.system, "system") if self.system else ""
        head = (ChatMessage("system", system),) if system else ()
        return head + _turns(self.messages)

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.to_spec(f"tools.{i}") for i, t in enumerate(self.tools or ()))

    def tool_fields(self) -> dict[str, Any]:
        """The request's tools, tool_choice and parallel_tool_calls, as GenerationRequest fields."""
        choice = self.tool_choice
        return {
            "tools": self.tool_specs(),
            "tool_choice": choice.to_choice() if choice else "auto",
            "parallel_tool_calls": (
                None
                if choice is None or choice.disable_parallel_tool_use is None
                else not choice.disable_parallel_tool_use
            ),
        }


class MessagesBody(_AnthropicBase):
    """POST /v1/messages."""

    max_tokens: int = Field(..., ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP)
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    stream: bool = False
    speculative: SpeculativeOptions | None = None

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


class CountTokensBody(_AnthropicBase):
    """POST /v1/messages/count_tokens."""

    def request(self) -> GenerationRequest:
        return GenerationRequest(
            messages=self.chat(), template_kwargs=self.template_kwargs(), **self.tool_fields()
        )


def messages_request(body: MessagesBody, spec: SpecParams) -> GenerationRequest:
    return GenerationRequest(
        messages=body.chat(),
        max_tokens=body.max_tokens,
        stop=stop_strings(body.stop_sequences),
        sampling=body.sampling(),
        speculative=spec_params(body.speculative, spec),
        template_kwargs=body.template_kwargs(),
        thinking_budget=body.thinking_budget(),
        json_schema=body.output_schema(),
        **body.tool_fields(),
    )
