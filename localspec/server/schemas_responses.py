"""OpenAI's Responses body (`/v1/responses`) as an engine request: the same ChatMessages as chat.

The daemon keeps no state between requests, so what needs it is refused by
name: `store: true`, `previous_response_id`, `conversation`, `background`.
Reasoning items a client sends back are skipped (this model writes none);
images, files, tools and structured output are refused, each with a clear 400.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from localspec.errors import UserInputError
from localspec.server.refusals import NO_TOOLS, NO_VISION
from localspec.server.schemas import SpeculativeOptions, _Body, spec_params
from localspec.types import ChatMessage, GenerationRequest, SamplingParams, SpecParams

STATELESS = "localspec keeps no responses (it is stateless); send the whole conversation in `input`"
_TEXT_PARTS = ("input_text", "output_text", "text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_TOOL_ITEMS = ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")


class InputItem(_Body):
    """One input item; messages (with or without `type: message`) carry text."""

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[dict[str, Any]] | None = None


def _content_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            raise UserInputError(f"{where}.content.{i}: {NO_VISION}", param=f"{where}.content")
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise UserInputError(
                f"{where}.content.{i}: {kind!r} parts are not supported; send text", param=where
            )
        texts.append(part["text"])
    return "".join(texts)


def _item_message(item: InputItem, where: str) -> ChatMessage | None:
    if item.type == "reasoning":
        return None
    if item.type in _TOOL_ITEMS:
        raise UserInputError(f"{where}: {NO_TOOLS}", param=where)
    if item.type != "message" or item.role is None:
        raise UserInputError(f"{where}: {item.type!r} items are not supported; send messages", param=where)
    role = "system" if item.role == "developer" else item.role
    return ChatMessage(role, _content_text(item.content, where))


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
    tools: list[dict[str, Any]] | None = None
    text: dict[str, Any] | None = None
    speculative: SpeculativeOptions | None = None

    def check_supported(self) -> None:
        if self.store:
            raise UserInputError(f"store: true is not supported; {STATELESS}", param="store")
        if self.previous_response_id or self.conversation:
            param = "previous_response_id" if self.previous_response_id else "conversation"
            raise UserInputError(f"{param} is not supported; {STATELESS}", param=param)
        if self.background:
            raise UserInputError(
                "background responses are not supported; localspec answers at once", param="background"
            )
        if self.tools:
            raise UserInputError(NO_TOOLS, param="tools")
        fmt = (self.text or {}).get("format") or {}
        if fmt.get("type") not in (None, "text"):
            raise UserInputError("only text.format {type: text} is supported", param="text.format")

    def chat(self) -> tuple[ChatMessage, ...]:
        head = (ChatMessage("system", self.instructions),) if self.instructions else ()
        if isinstance(self.input, str):
            return (*head, ChatMessage("user", self.input))
        turns = (_item_message(item, f"input.{i}") for i, item in enumerate(self.input))
        return (*head, *(m for m in turns if m is not None))


def responses_request(body: ResponsesBody, spec: SpecParams, unlimited: int) -> GenerationRequest:
    body.check_supported()
    messages = body.chat()
    if not messages:
        raise UserInputError("input holds no message", param="input")
    return GenerationRequest(
        messages=messages,
        max_tokens=body.max_output_tokens or unlimited,
        sampling=SamplingParams(temperature=body.temperature, top_p=body.top_p),
        speculative=spec_params(body.speculative, spec),
    )
