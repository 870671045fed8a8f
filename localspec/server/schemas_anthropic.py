"""Anthropic's Messages body (`/v1/messages`: Claude Code, the `anthropic` SDK) as an engine request.

It becomes the same `GenerationRequest` of `ChatMessage`s that OpenAI's chat does.
Text blocks are joined by a blank line; blocks this daemon cannot serve (images,
documents, tool use) are refused by name rather than dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from localspec.errors import UserInputError
from localspec.server.refusals import NO_TOOLS, NO_VISION
from localspec.server.schemas import MAX_STOP, SpeculativeOptions, _Body, spec_params, stop_strings
from localspec.types import ChatMessage, GenerationRequest, SamplingParams, SpecParams


class ContentBlock(_Body):
    """One block of a message or system prompt; only `text` blocks carry what this daemon reads."""

    type: str
    text: str | None = None


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


def block_text(content: str | list[ContentBlock], where: str) -> str:
    """The text of a content field; a block that is not text is a clear error."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for i, block in enumerate(content):
        if block.type in ("image", "document"):
            raise UserInputError(f"{where}.content.{i}: {NO_VISION}", param=f"{where}.content")
        if block.type in ("tool_use", "tool_result", "server_tool_use"):
            raise UserInputError(f"{where}.content.{i}: {NO_TOOLS}", param=f"{where}.content")
        if block.type != "text" or block.text is None:
            raise UserInputError(
                f"{where}.content.{i}: {block.type!r} blocks are not supported; send text", param=where
            )
        texts.append(block.text)
    return "\n\n".join(texts)


class _AnthropicBase(_Body):
    model: str = Field(..., min_length=1)
    messages: list[AnthropicMessage] = Field(..., min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[dict[str, Any]] | None = None

    def chat(self) -> tuple[ChatMessage, ...]:
        if self.tools:
            raise UserInputError(NO_TOOLS, param="tools")
        system = block_text(self.system, "system") if self.system else ""
        head = (ChatMessage("system", system),) if system else ()
        turns = tuple(
            ChatMessage(m.role, block_text(m.content, f"messages.{i}")) for i, m in enumerate(self.messages)
        )
        return head + turns


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


def messages_request(body: MessagesBody, spec: SpecParams) -> GenerationRequest:
    return GenerationRequest(
        messages=body.chat(),
        max_tokens=body.max_tokens,
        stop=stop_strings(body.stop_sequences),
        sampling=body.sampling(),
        speculative=spec_params(body.speculative, spec),
    )
