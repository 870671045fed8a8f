"""OpenAI's Responses API (`/v1/responses`), stateless: a message of output text and function calls.

Requests become the same GenerationRequest as chat; `ResponsesFormat` builds the
Response object from the GenerationResult, or streams OpenAI's event sequence:
response.created, response.in_progress, then for a thinking model's reasoning a reasoning
item (response.output_item.added, response.content_part.added,
response.reasoning_text.delta..., response.reasoning_text.done, response.content_part.done,
response.output_item.done), for the message response.output_item.added,
response.content_part.added, response.output_text.delta..., response.output_text.done,
response.content_part.done, response.output_item.done; for each function call
response.output_item.added, response.function_call_arguments.delta and .done,
response.output_item.done (a custom tool's: response.custom_tool_call_input.delta and
.done between them); then response.completed (response.incomplete when
max_output_tokens cut it short).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from localspec.errors import LocalspecError
from localspec.server.logprobs import chat_entries
from localspec.server.responses import json_bytes, stats_fields
from localspec.server.schemas import parse_body
from localspec.server.schemas_responses import ResponsesBody, responses_request
from localspec.server.state import server_state
from localspec.server.streaming import respond
from localspec.server.toolschemas import custom_input
from localspec.types import GenerationResult, TokenChunk, TokenLogprob, ToolCall, parallel_calls


class ResponsesFormat:
    """A Response: a reasoning item where a thinking model reasoned, an assistant message holding one
    output_text part, then a function_call item per call.

    Streamed, the message opens with the first text; a call's text is held back by the engine
    while it is written, so each function_call item goes out whole at the end, its arguments in
    one delta. A response of calls alone has no message item.
    """

    media_type = "text/event-stream"

    def __init__(self, model: str, body: ResponsesBody) -> None:
        self.model = model
        self.body = body
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.item_id = "msg_" + uuid.uuid4().hex[:24]
        self.reasoning_id = "rs_" + uuid.uuid4().hex[:24]
        self._thought: str | None = None  # the reasoning streamed so far; None: no reasoning item
        self._thought_done = False
        self.created = int(time.time())
        self._seq = 0
        self._started = False
        self._opened = False  # the message item was announced
        self._calls: list[dict[str, Any]] | None = None
        self.logprobs = body.logprobs_asked() is not None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\n".encode() + b"data: " + json_bytes(data) + b"\n\n"

    def _logprobs(self, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """The tokens' log-probabilities where `include` asked for them (else empty, as OpenAI's)."""
        return chat_entries(logprobs) if self.logprobs else []

    def _part(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": self._logprobs(logprobs)}

    def _item(self, text: str | None, logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "type": "message",
            "status": "in_progress" if text is None else "completed",
            "role": "assistant",
            "content": [] if text is None else [self._part(text, logprobs)],
        }

    def _call_items(self, result: GenerationResult) -> list[dict[str, Any]]:
        """The result's calls as function_call items (custom_tool_call for a custom tool's), made
        once so stream and body share their ids."""
        if self._calls is None:
            custom = self.body.custom_names()
            self._calls = [_call_item(c, c.name in custom) for c in result.tool_calls]
        return self._calls

    def _reasoning_item(self, text: str | None) -> dict[str, Any]:
        return {
            "id": self.reasoning_id,
            "type": "reasoning",
            "status": "in_progress" if text is None else "completed",
            "summary": [],
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}],
        }

    def _output(self, result: GenerationResult) -> list[dict[str, Any]]:
        reasoning = [self._reasoning_item(result.reasoning)] if result.reasoning else []
        message = [self._item(result.text, result.logprobs)] if result.text or not result.tool_calls else []
        return reasoning + message + self._call_items(result)

    def _response(self, result: GenerationResult | None) -> dict[str, Any]:
        status = "in_progress"
        if result is not None:
            status = "incomplete" if result.finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.body.instructions,
            "max_output_tokens": self.body.max_output_tokens,
            "model": self.model,
            "output": self._output(result) if result is not None else [],
            "parallel_tool_calls": parallel_calls(self.body.parallel_tool_calls, self.body.choice()),
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": self.body.temperature,
            "text": {"format": self.body.format()},
            "tool_choice": self.body.tool_choice,
            "tools": [t.echo() for t in self.body.given_tools],
            "top_p": self.body.top_p,
            "truncation": self.body.truncation,
            "metadata": {},
        }
        if result is not None:
            out["usage"] = _usage(result)
            out.update(stats_fields(result.stats))
        return out

    def _message_index(self) -> int:
        """The message's place among the output items: after the reasoning item, where there is one."""
        return 0 if self._thought is None else 1

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": self._message_index(), "content_index": 0}

    def _think(self, delta: str) -> bytes:
        """A piece of reasoning; the first opens the reasoning item (always the first item)."""
        head = b""
        at = {"item_id": self.reasoning_id, "output_index": 0}
        if self._thought is None:
            self._thought = ""
            head = self._event(
                "response.output_item.added", output_index=0, item=self._reasoning_item(None)
            ) + self._event("response.content_part.added", **at, content_index=0, part=_reasoning_part(""))
        self._thought += delta
        return head + self._event("response.reasoning_text.delta", **at, content_index=0, delta=delta)

    def _close_reasoning(self) -> bytes:
        if self._thought is None or self._thought_done:
            return b""
        self._thought_done = True
        text, at = self._thought, {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        return b"".join(
            [
                self._event("response.reasoning_text.done", **at, text=text),
                self._event("response.content_part.done", **at, part=_reasoning_part(text)),
                self._event("response.output_item.done", output_index=0, item=self._reasoning_item(text)),
            ]
        )

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        head = self._response(None)
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    def _open(self) -> bytes:
        if self._opened:
            return b""
        self._opened = True
        added = self._event(
            "response.output_item.added", output_index=self._message_index(), item=self._item(None)
        )
        return (
            self._close_reasoning()
            + added
            + self._event("response.content_part.added", **self._at(), part=self._part(""))
        )

    def chunk(self, chunk: TokenChunk) -> bytes:
        # Events are numbered in the order they are made: the start first.
        out = [self._start()]
        if chunk.reasoning:
            out.append(self._think(chunk.reasoning))
        if chunk.text:  # else a step whose text is held back (a call being written), or reasoning
            logprobs = self._logprobs(chunk.logprobs)
            out.append(self._open())
            out.append(
                self._event("response.output_text.delta", **self._at(), delta=chunk.text, logprobs=logprobs)
            )
        return b"".join(out)

    def _close_message(self, result: GenerationResult) -> bytes:
        text, logprobs = result.text, result.logprobs
        return b"".join(
            [
                self._open(),
                self._event(
                    "response.output_text.done", **self._at(), text=text, logprobs=self._logprobs(logprobs)
                ),
                self._event("response.content_part.done", **self._at(), part=self._part(text, logprobs)),
                self._event(
                    "response.output_item.done",
                    output_index=self._message_index(),
                    item=self._item(text, logprobs),
                ),
            ]
        )

    def _call_events(self, index: int, item: dict[str, Any]) -> bytes:
        at = {"item_id": item["id"], "output_index": index}
        field, kind = (
            ("input", "custom_tool_call_input")
            if "input" in item
            else ("arguments", "function_call_arguments")
        )
        return b"".join(
            [
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", field: ""},
                ),
                self._event(f"response.{kind}.delta", **at, delta=item[field]),
                self._event(f"response.{kind}.done", **at, **{field: item[field]}),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        )

    def final(self, result: GenerationResult) -> bytes:
        out = [self._start(), self._close_reasoning()]
        first = self._message_index()
        if self._opened or result.text or not result.tool_calls:
            out.append(self._close_message(result))
            first += 1
        out.extend(self._call_events(first + i, item) for i, item in enumerate(self._call_items(result)))
        whole = self._response(result)
        end = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        out.append(self._event(end, response=whole))
        return b"".join(out)

    def error(self, exc: LocalspecError) -> bytes:
        return self._event("error", code=exc.code, message=exc.message, param=exc.param)

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return self._response(result)


def _call_item(call: ToolCall, custom: bool) -> dict[str, Any]:
    """A call as an output item: a function_call, or a custom tool's custom_tool_call (its input the text)."""
    kind, prefix, field, value = (
        ("custom_tool_call", "ctc_", "input", custom_input(call.arguments))
        if custom
        else ("function_call", "fc_", "arguments", call.arguments)
    )
    return {
        "id": prefix + uuid.uuid4().hex[:24],
        "type": kind,
        "status": "completed",
        "call_id": "call_" + uuid.uuid4().hex[:24],
        "name": call.name,
        field: value,
    }


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _usage(result: GenerationResult) -> dict[str, Any]:
    prompt, output = result.stats.prompt_tokens, result.stats.tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": result.stats.cached_tokens},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": result.stats.reasoning_tokens},
        "total_tokens": prompt + output,
    }


async def create(request: Request) -> Response:
    body = parse_body(await request.body(), ResponsesBody)
    state = await server_state(request).use(request, body.model)
    model = state.resolve_model(body.model)
    greq = responses_request(body, state.spec_default, state.unlimited)
    return await respond(
        await state.start(request, greq, body.stream), body.stream, ResponsesFormat(model, body)
    )


ROUTES = [Route("/v1/responses", create, methods=["POST"]), Route("/responses", create, methods=["POST"])]
