"""OpenAI's Responses API (`/v1/responses`): a message of output text and function calls, kept
(unless `store: false`) to be continued by `previous_response_id`, read back by
`GET /v1/responses/{id}` and `.../input_items`, and deleted by `DELETE`; in a `conversation`
(conversations_api), its input and output are added to the conversation's items.

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

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.engine.callstream import FieldText
from localspec.errors import LocalspecError, UserInputError
from localspec.server.logprobs import chat_entries
from localspec.server.response_store import (
    ConversationStore,
    NotKeptError,
    ResponseStore,
    StoredResponse,
    turns_size,
)
from localspec.server.responses import json_bytes, stats_fields, text_after, unsent
from localspec.server.schemas import parse_body
from localspec.server.schemas_responses import ResponsesBody, item_turns, responses_request
from localspec.server.state import ServerState, server_state
from localspec.server.streaming import respond
from localspec.server.toolschemas import CUSTOM_INPUT, custom_input
from localspec.types import (
    CallDelta,
    ChatMessage,
    GenerationResult,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    parallel_calls,
)

log = logging.getLogger("localspec.api")


class ResponsesFormat:
    """A Response: a reasoning item where a thinking model reasoned, an assistant message holding one
    output_text part, then a function_call item per call.

    Streamed, the message opens with the first text. Calls stream as the model writes them, where
    the engine streams them (a grammar holds them): the item before closes (the message, the
    reasoning, the call before), the call's item opens, and its arguments (a custom tool's input,
    decoded) go out piece by piece; text after the calls comes as a message item after them. A
    call that did not stream goes out whole at the end, in one delta. A response of calls alone has
    no message item.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        model: str,
        body: ResponsesBody,
        store: ResponseStore | None = None,
        history: tuple[ChatMessage, ...] = (),
        conversations: ConversationStore | None = None,
    ) -> None:
        """`store`: where the finished response is kept (a request with store: false gives none);
        `history`: its conversation without the instructions, kept with it to be continued;
        `conversations`: where the request's conversation is, to add its input and output to."""
        self.model = model
        self.body = body
        self.store = store
        self.history = history
        self.conversations = conversations
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
        self._cut: list[dict[str, Any]] | None = None
        self._said = ""  # the message's text streamed so far
        self._said_logprobs: list[TokenLogprob] = []
        self._message_done: dict[str, Any] | None = None  # the message as closed when a call began
        self._streamed: dict[int, _Streamed] = {}  # the calls that streamed, by their index
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

    def _item(
        self, text: str | None, logprobs: Sequence[TokenLogprob] = (), item_id: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": item_id or self.item_id,
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
            for i, streamed in self._streamed.items():
                if i < len(self._calls) and self._calls[i]["name"] == streamed.item["name"]:
                    ids = {"id": streamed.item["id"], "call_id": streamed.item["call_id"]}
                    self._calls[i] = {**self._calls[i], **ids}
        return self._calls

    def _cut_calls(self, result: GenerationResult) -> list[dict[str, Any]]:
        """The call the reply ended inside (max_output_tokens): an incomplete item holding the start
        of it (no call the next turn answers); streamed, the ids it streamed with."""
        if self._cut is None:
            cut, kept = [], {item["id"] for item in self._call_items(result)}
            if result.cut_call is not None:
                item = _call_item(result.cut_call, result.cut_call.name in self.body.custom_names())
                streamed = self._streamed.get(len(result.tool_calls))
                if streamed is not None and streamed.item["name"] == item["name"]:
                    item = {**item, "id": streamed.item["id"], "call_id": streamed.item["call_id"]}
                cut.append({**item, "status": "incomplete"})
            # A streamed call the result holds neither whole nor cut (not expected): as it was sent.
            kept |= {item["id"] for item in cut}
            cut += [
                {**s.item, "status": "incomplete", _field(s.item): s.sent}
                for s in self._streamed.values()
                if s.item["id"] not in kept
            ]
            self._cut = cut
        return self._cut

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
        if not self._streamed:
            shown = result.text or not result.calls_shown()
            message = [self._item(result.text, result.logprobs)] if shown else []
            return reasoning + message + self._call_items(result) + self._cut_calls(result)
        before = [self._message_done] if self._message_done is not None else []
        rest = text_after(self._said, result.text)
        after = [self._item(rest, (), self.item_id + "_after")] if rest else []
        return reasoning + before + self._call_items(result) + self._cut_calls(result) + after

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
            "previous_response_id": self.body.previous_response_id,
            "conversation": {"id": conversation} if (conversation := self.body.conversation_id()) else None,
            "reasoning": {"effort": None, "summary": None},
            "store": self.store is not None,
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
        if chunk.reasoning and not self._streamed:
            out.append(self._think(chunk.reasoning))
        # Else a step whose text is held back (a call being written), or reasoning; text after a
        # streamed call goes out at the end, after the calls.
        if chunk.text and not self._streamed:
            logprobs = self._logprobs(chunk.logprobs)
            out.append(self._open())
            out.append(
                self._event("response.output_text.delta", **self._at(), delta=chunk.text, logprobs=logprobs)
            )
            self._said += chunk.text
            self._said_logprobs.extend(chunk.logprobs)
        out.extend(self._call_piece(delta) for delta in chunk.calls)
        return b"".join(out)

    def _call_piece(self, delta: CallDelta) -> bytes:
        """A piece of a streaming call; a call's first closes the item before it and opens its own."""
        out = []
        streamed = self._streamed.get(delta.index)
        if streamed is None:
            if not delta.name:
                return b""
            last = self._last_streamed()
            if last is None:
                out.append(self._close_reasoning())
                if self._opened:
                    text, logprobs = self._said.strip(), tuple(self._said_logprobs)
                    out.append(self._close_message(text, logprobs))
                    self._message_done = self._item(text, logprobs)
            else:  # the call before it is whole: its arguments were all sent
                item = {**last.item, _field(last.item): last.sent}
                out.append(self._end_call(last.index, item, last.sent))
            custom = delta.name in self.body.custom_names()
            index = self._message_index() + self._opened + len(self._streamed)
            streamed = _Streamed(_call_item(ToolCall(delta.name, ""), custom), index, custom)
            self._streamed[delta.index] = streamed
            added = {**streamed.item, "status": "in_progress"}
            out.append(self._event("response.output_item.added", output_index=index, item=added))
        piece = streamed.input.feed(delta.arguments) if streamed.input is not None else delta.arguments
        if piece:
            streamed.sent += piece
            at = {"item_id": streamed.item["id"], "output_index": streamed.index}
            out.append(self._event(f"response.{_kind(streamed.item)}.delta", **at, delta=piece))
        return b"".join(out)

    def _last_streamed(self) -> _Streamed | None:
        return next(reversed(self._streamed.values()), None)

    def _end_call(self, index: int, item: dict[str, Any], sent: str) -> bytes:
        """A streamed call's end: what is left of it after `sent`, its done event and its whole item."""
        field = _field(item)
        value = item[field]
        rest = unsent(value, sent)
        at = {"item_id": item["id"], "output_index": index}
        kind = _kind(item)
        return b"".join(
            [
                self._event(f"response.{kind}.delta", **at, delta=rest) if rest else b"",
                self._event(f"response.{kind}.done", **at, **{field: value}),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        )

    def _whole_message(self, index: int, item: dict[str, Any]) -> bytes:
        """A message item sent whole (the text after a streamed call)."""
        text = item["content"][0]["text"]
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return b"".join(
            [
                self._event("response.output_item.added", output_index=index, item={**item, "content": []}),
                self._event("response.content_part.added", **at, part=self._part("")),
                self._event("response.output_text.delta", **at, delta=text, logprobs=[]),
                self._event("response.output_text.done", **at, text=text, logprobs=[]),
                self._event("response.content_part.done", **at, part=self._part(text)),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        )

    def _close_message(self, text: str, logprobs: Sequence[TokenLogprob]) -> bytes:
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
        field, kind = _field(item), _kind(item)
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
        if not self._streamed:
            first = self._message_index()
            if self._opened or result.text or not result.calls_shown():
                out.append(self._close_message(result.text, result.logprobs))
                first += 1
            calls = self._call_items(result) + self._cut_calls(result)
            out.extend(self._call_events(first + i, item) for i, item in enumerate(calls))
        else:
            out.append(self._after_call(result))
        whole = self._kept(result)
        end = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        out.append(self._event(end, response=whole))
        return b"".join(out)

    def _after_call(self, result: GenerationResult) -> bytes:
        """Where calls streamed: the last one's end, then the items after it, whole."""
        out, last = [], self._last_streamed()
        assert last is not None
        items = self._output(result)
        at = next(i for i, item in enumerate(items) if item["id"] == last.item["id"])
        for index, item in enumerate(items[at:], start=at):
            if index == at:
                out.append(self._end_call(index, item, last.sent))
            elif item["type"] == "message":
                out.append(self._whole_message(index, item))
            else:
                out.append(self._call_events(index, item))
        return b"".join(out)

    def error(self, exc: LocalspecError) -> bytes:
        return self._event("error", code=exc.code, message=exc.message, param=exc.param)

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return self._kept(result)

    def _kept(self, result: GenerationResult) -> dict[str, Any]:
        """The finished Response, kept where the request asked (a failed one never is)."""
        whole = self._response(result)
        conversation = self.body.conversation_id()
        if self.conversations is not None and conversation is not None:
            added = [*self.body.input_items, *whole["output"]]
            try:
                self.conversations.change(conversation, lambda c: c.items.extend(added))
            except NotKeptError:  # deleted (or forgotten) while the reply was written: the reply stands
                log.info("conversation %s went while a response in it was written", conversation)
        if self.store is not None:
            # The reply as the next request's history: its text and its calls, by the call_ids
            # the client's outputs will answer (reasoning left out, as a client sending the
            # items back leaves it: the same prompt either way).
            calls = tuple(
                ToolCall(c.name, c.arguments, item["call_id"])
                for c, item in zip(result.tool_calls, self._call_items(result), strict=True)
            )
            turns = (*self.history, ChatMessage("assistant", result.text, calls))
            size = turns_size(turns) + len(json_bytes(whole))
            self.store.put(self.id, StoredResponse(turns, tuple(self.body.input_items), whole, size))
        return whole


class _Streamed:
    """A call that streams: its item, its place among the output items, and what of its arguments
    (a custom tool's input, decoded) was sent."""

    def __init__(self, item: dict[str, Any], index: int, custom: bool) -> None:
        self.item = item
        self.index = index
        self.sent = ""
        self.input = FieldText(CUSTOM_INPUT) if custom else None


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


def _field(item: dict[str, Any]) -> str:
    """The field a call item's text is in: a function call's arguments, a custom tool's input."""
    return "input" if item["type"] == "custom_tool_call" else "arguments"


def _kind(item: dict[str, Any]) -> str:
    """The name its streamed pieces' events go by."""
    return "custom_tool_call_input" if item["type"] == "custom_tool_call" else "function_call_arguments"


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
    server = server_state(request)
    body.check_supported()
    history = body.history(_before(server, body))
    state = await server.use(request, body.model)
    model = state.resolve_model(body.model)
    greq = responses_request(body, state.spec_default, state.unlimited, history)
    kept = server.responses if body.stored else None
    fmt = ResponsesFormat(model, body, kept, history, server.conversations)
    return await respond(await state.start(request, greq, body.stream), body.stream, fmt)


def _before(server: ServerState, body: ResponsesBody) -> tuple[ChatMessage, ...]:
    """What the request goes on from: the kept response's turns, or its conversation's items."""
    if body.previous_response_id:
        return server.responses.previous(body.previous_response_id).turns
    conversation = body.conversation_id()
    if conversation is None:
        return ()
    return item_turns(server.conversations.items(conversation, "conversation"), "conversation.items")


async def retrieve(request: Request) -> Response:
    if request.query_params.get("stream") in ("true", "1"):
        raise UserInputError(
            "stream: a kept response is replayed for background responses only, and localspec "
            "answers at once; GET it without stream",
            param="stream",
        )
    return JSONResponse(server_state(request).responses.get(request.path_params["id"]).body)


async def delete(request: Request) -> Response:
    response_id = request.path_params["id"]
    server_state(request).responses.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: Request) -> Response:
    """The input items of a kept response, a page at a time (`limit`, `order`, `after`), as OpenAI's."""
    items = list(server_state(request).responses.get(request.path_params["id"]).input_items)
    return JSONResponse(item_page(items, request))


def item_page(items: list[dict[str, Any]], request: Request) -> dict[str, Any]:
    """A page of items as OpenAI lists them: newest first unless `order=asc`, `limit` (1-100,
    20) from the one after `after`."""
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise UserInputError("order must be asc or desc", param="order")
    limit = _limit(query.get("limit", "20"))
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise UserInputError(f"after: no item {after!r} is among these", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _limit(text: str) -> int:
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise UserInputError(f"limit must be a whole number from 1 to 100, not {text!r}", param="limit")
    return limit


ROUTES = [
    route
    for prefix in ("/v1", "")
    for route in (
        Route(f"{prefix}/responses", create, methods=["POST"]),
        Route(f"{prefix}/responses/{{id}}", retrieve, methods=["GET"]),
        Route(f"{prefix}/responses/{{id}}", delete, methods=["DELETE"]),
        Route(f"{prefix}/responses/{{id}}/input_items", input_items, methods=["GET"]),
    )
]
