"""OpenAI's routes: `/v1/chat/completions`, `/v1/completions` (with `suffix` for FIM), `/v1/models`.

Each is served without the `/v1` prefix too, as llama-server does: clients configured with a
bare base URL (`http://localhost:8012`) call `/chat/completions`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.errors import LocalspecError
from localspec.server.catalog import ServedModel
from localspec.server.logprobs import chat_entries, legacy_lists
from localspec.server.responses import (
    finish_reason,
    json_bytes,
    openai_error_body,
    progress_fields,
    stats_fields,
    unsent,
)
from localspec.server.schemas import (
    ChatCompletionBody,
    CompletionBody,
    chat_request,
    completion_requests,
    parse_body,
)
from localspec.server.state import ModelState, Run, server_state
from localspec.server.streaming import frames, respond, stream_response
from localspec.server.toolschemas import custom_names, openai_tool_calls
from localspec.types import CallDelta, GenerationRequest, GenerationResult, TokenChunk, TokenLogprob


class OpenAIFormat:
    """Chat completions (`delta`/`message`) or text completions (`text`), as OpenAI shapes them."""

    media_type = "text/event-stream"

    def __init__(
        self,
        model: str,
        chat: bool,
        include_usage: bool,
        logprobs: bool = False,
        n: int = 1,
        prompts: int = 1,
        echo: Sequence[str] | None = None,
        custom: frozenset[str] = frozenset(),
    ) -> None:
        """`n`: the choices each of `prompts` has (more than one prompt: text completions only);
        `echo`: each prompt's text, where a text completion echoes it before its choices' text;
        `custom`: the custom tools' names (a chat's calls to them carry their input as text)."""
        self.custom = custom
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.per_prompt = n
        self.n = n * prompts  # choices, generated one after another
        self.echo = echo
        self.index = 0  # the choice being formatted
        self.ended: list[GenerationResult] = []  # the choices whose final frame went out
        self._offset = 0  # a streamed completion's text so far, where its tokens' offsets count from
        self._echoed = False  # whether this streamed choice's prompt went out
        self._streamed: dict[int, str] = {}  # each streaming call's arguments sent so far, by index
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self._role_sent = False

    def next_choice(self) -> None:
        """The frames that follow are the next choice's: its index, its own role and offsets."""
        self.index += 1
        self._role_sent = False
        self._offset = 0
        self._echoed = False
        self._streamed = {}

    def _echo_text(self) -> str:
        return self.echo[self.index // self.per_prompt] if self.echo else ""

    def _head(self, streamed: bool) -> dict[str, Any]:
        obj = f"{self.object}.chunk" if streamed and self.chat else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(
        self,
        text: str | None,
        finish: str | None,
        logprobs: Sequence[TokenLogprob] = (),
        reasoning: str = "",
    ) -> dict[str, Any]:
        if not self.chat:
            return {
                "index": self.index,
                "text": text or "",
                "logprobs": self._logprobs(logprobs),
                "finish_reason": finish,
            }
        # A step whose text is held back (a tool call being written) sends no content.
        delta: dict[str, Any] = {"content": text} if text else {}
        if reasoning:  # a thinking model's reasoning: llama-server's and vLLM's field
            delta["reasoning_content"] = reasoning
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        return {
            "index": self.index,
            "delta": delta,
            "logprobs": self._logprobs(logprobs),
            "finish_reason": finish,
        }

    def _logprobs(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """choices[].logprobs where asked: chat's `content` entries, or text completions' lists."""
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": chat_entries(logprobs), "refusal": None}
        lists = legacy_lists(logprobs, self._offset)
        self._offset += sum(len(lp.text) for lp in logprobs)
        return lists

    @staticmethod
    def _sse(data: dict[str, Any]) -> bytes:
        return b"data: " + json_bytes(data) + b"\n\n"

    def chunk(self, chunk: TokenChunk) -> bytes:
        if chunk.prompt:  # the prompt scored: its text goes out with its tokens' log-probabilities
            return self._echo(chunk.logprobs)
        if chunk.progress is not None:  # llama-server's return_progress: a choice with nothing in it
            choice = self._choice(None, None)
            return self._sse({**self._head(True), "choices": [choice], **progress_fields(chunk.progress)})
        # localspec extension: token ids and how many came from the draft, for live acceptance views.
        extra = {"token_ids": list(chunk.token_ids), "from_draft": chunk.from_draft}
        choice = self._choice(chunk.text, None, chunk.logprobs, chunk.reasoning)
        pieces = [p for d in chunk.calls if (p := self._call_piece(d)) is not None] if self.chat else []
        if pieces:
            choice["delta"]["tool_calls"] = pieces
        return self._echo() + self._sse({**self._head(True), "choices": [choice], "localspec": extra})

    def _call_piece(self, delta: CallDelta) -> dict[str, Any] | None:
        """A streaming call's delta as OpenAI sends one: the first with its id, type and name, the
        rest its arguments alone. A custom tool's call goes whole at the end (its input is text)."""
        index = delta.index
        if index not in self._streamed:
            if not delta.name or delta.name in self.custom:
                return None
            self._streamed[index] = delta.arguments
            function = {"name": delta.name, "arguments": delta.arguments}
            return {
                "index": index,
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": function,
            }
        self._streamed[index] += delta.arguments
        return {"index": index, "function": {"arguments": delta.arguments}}

    def _echo(self, logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """A streamed choice's prompt, once, before its first text."""
        if not self.echo or self._echoed:
            return b""
        self._echoed = True
        return self._sse({**self._head(True), "choices": [self._choice(self._echo_text(), None, logprobs)]})

    def final(self, result: GenerationResult) -> bytes:
        frames = [self._echo()]  # where nothing was generated
        calls = self._last_pieces(result)
        if calls:
            choice = {
                "index": self.index,
                "delta": {"tool_calls": calls},
                "logprobs": None,
                "finish_reason": None,
            }
            frames.append(self._sse({**self._head(True), "choices": [choice]}))
        last = {**self._choice(None, finish_reason(result)), "logprobs": None}  # each token's went with it
        body = {**self._head(True), "choices": [last]}
        frames.append(self._sse({**body, **stats_fields(result.stats)}))
        self.ended.append(result)
        if len(self.ended) < self.n:  # the next choice follows
            return b"".join(frames)
        if self.include_usage:
            frames.append(
                self._sse({**self._head(True), "choices": [], "usage": _usage(self.ended, self.per_prompt)})
            )
        return b"".join(frames) + b"data: [DONE]\n\n"

    def _last_pieces(self, result: GenerationResult) -> list[dict[str, Any]]:
        """The calls in one delta each (clients join the deltas of an index into one call); those
        that streamed, what is left of their arguments."""
        pieces = []
        for i, call in enumerate(self._tool_calls(result)):
            sent = self._streamed.get(i)
            if sent is None:
                pieces.append({"index": i, **call})
                continue
            rest = unsent(call["function"]["arguments"], sent)
            if rest:
                pieces.append({"index": i, "function": {"arguments": rest}})
        return pieces

    def error(self, exc: LocalspecError) -> bytes:
        return self._sse(openai_error_body(exc))

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return self.whole_choices([result])

    def whole_choices(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        """The body of every choice; the usage counts the prompt once, as OpenAI's does."""
        choices = []
        for i, result in enumerate(results):
            self.index = i
            choices.append(self._whole_choice(result))
        return {
            **self._head(False),
            "choices": choices,
            "usage": _usage(results, self.per_prompt),
            **stats_fields(results[-1].stats),
        }

    def _whole_choice(self, result: GenerationResult) -> dict[str, Any]:
        finish = finish_reason(result)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": result.text}
            if result.reasoning:
                message["reasoning_content"] = result.reasoning
            if result.calls_shown():  # a call cut short too, its arguments the start written
                message["content"] = result.text or None
                message["tool_calls"] = self._tool_calls(result)
            return {
                "index": self.index,
                "message": message,
                "logprobs": self._logprobs(result.logprobs),
                "finish_reason": finish,
            }
        self._offset = 0
        if self.echo:
            scored = (*result.prompt_logprobs, *result.logprobs)
            return self._choice(self._echo_text() + result.text, finish, scored)
        return self._choice(result.text, finish, result.logprobs)

    def _tool_calls(self, result: GenerationResult) -> list[dict[str, Any]]:
        calls = result.calls_shown()
        ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in calls]
        return openai_tool_calls(list(calls), ids, self.custom)


def _usage(results: Sequence[GenerationResult], per_prompt: int = 1) -> dict[str, Any]:
    """Every choice's tokens, each prompt's once (its `per_prompt` choices read the same prompt)."""
    prompt = sum(r.stats.prompt_tokens for r in results[::per_prompt])
    completion = sum(r.stats.tokens for r in results)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        # The prompt's tokens taken from a cache rather than read (the last request's, or a saved one).
        "prompt_tokens_details": {"cached_tokens": sum(r.stats.cached_tokens for r in results[::per_prompt])},
    }
    details: dict[str, int] = {}
    predicted = sum(r.stats.prediction_tokens for r in results)
    if predicted:  # as OpenAI counts a prediction: its tokens the reply has, and not
        accepted = sum(r.stats.prediction_accepted for r in results)
        details["accepted_prediction_tokens"] = accepted
        details["rejected_prediction_tokens"] = predicted - accepted
    reasoning = sum(r.stats.reasoning_tokens for r in results)
    if reasoning:  # a thinking model's, of completion_tokens
        details["reasoning_tokens"] = reasoning
    if details:
        usage["completion_tokens_details"] = details
    return usage


async def chat_completions(request: Request) -> Response:
    body = parse_body(await request.body(), ChatCompletionBody)
    state = await server_state(request).use(request, body.model)
    model = state.resolve_model(body.model)
    greq = chat_request(body, state.spec_default, state.unlimited)
    fmt = OpenAIFormat(
        model, True, body.include_usage(), logprobs=body.logprobs, n=body.n, custom=custom_names(body.tools)
    )
    return await _respond(state, request, [_nth(greq, i) for i in range(body.n)], body.stream, fmt)


async def completions(request: Request) -> Response:
    body = parse_body(await request.body(), CompletionBody)
    state = await server_state(request).use(request, body.model)
    model = state.resolve_model(body.model)
    prompts = completion_requests(body, state.spec_default, state.unlimited)
    echo = [await _prompt_text(state, p) for p in prompts] if body.echo else None
    fmt = OpenAIFormat(
        model, False, body.include_usage(), body.logprobs is not None, body.n, len(prompts), echo
    )
    choices = [_nth(greq, i) for greq in prompts for i in range(body.n)]
    return await _respond(state, request, choices, body.stream, fmt)


async def _prompt_text(state: ModelState, greq: GenerationRequest) -> str:
    """The text a completion echoes: its prompt as given, or its token ids' text."""
    if greq.prompt_ids is None:
        return greq.prompt or ""
    pieces = await anyio.to_thread.run_sync(state.engine.pieces, list(greq.prompt_ids))
    return b"".join(pieces).decode("utf-8", errors="replace")


async def _respond(
    state: ModelState, request: Request, requests: list[GenerationRequest], stream: bool, fmt: OpenAIFormat
) -> Response:
    """One choice as any request; more one after another (a prompt's cache reused by its next), each
    of a prompt's sampled with its own seed (the request's plus its index, where one is given)."""
    if len(requests) == 1:
        return await respond(await state.start(request, requests[0], stream), stream, fmt)
    if not stream:
        results = []
        for one in requests:
            run = await state.start(request, one, False)
            try:
                results.append(await run.collect())
            finally:
                run.close()
        return JSONResponse(fmt.whole_choices(results))
    run = await state.start(request, requests[0], True)
    try:
        first = await run.next()  # an early error keeps its HTTP status, as one choice's does
    except BaseException:
        run.close()
        raise
    return stream_response(_choices(state, request, requests, run, first, fmt), fmt)


async def _choices(
    state: ModelState,
    request: Request,
    requests: list[GenerationRequest],
    run: Run,
    first: TokenChunk | GenerationResult,
    fmt: OpenAIFormat,
) -> AsyncIterator[bytes]:
    for i in range(len(requests)):
        if i:
            if len(fmt.ended) < i:  # the last choice ended in an error frame
                return
            fmt.next_choice()
            try:
                run = await state.start(request, requests[i], True)
                first = await run.next()
            except LocalspecError as exc:
                run.close()
                yield fmt.error(exc)
                return
        async for frame in frames(run, first, fmt):
            yield frame


def _nth(greq: GenerationRequest, i: int) -> GenerationRequest:
    seed = greq.sampling.seed
    if i == 0 or seed is None or greq.sampling.greedy:
        return greq
    return replace(greq, sampling=replace(greq.sampling, seed=seed + i))


def _model_entry(model: ServedModel) -> dict[str, Any]:
    try:
        created = int(model.path.stat().st_mtime)
    except OSError:
        created = 0
    return {"id": model.name, "object": "model", "created": created, "owned_by": "localspec"}


async def list_models(request: Request) -> Response:
    """Every model the daemon serves (each loads on its first request), the default first."""
    models = await anyio.to_thread.run_sync(server_state(request).catalog.models)
    return JSONResponse({"object": "list", "data": [_model_entry(m) for m in models]})


async def get_model(request: Request) -> Response:
    catalog = server_state(request).catalog
    model = await anyio.to_thread.run_sync(catalog.resolve, request.path_params["model"])
    return JSONResponse(_model_entry(model))


_ROUTES = [
    ("/models", list_models, "GET"),
    ("/models/{model:path}", get_model, "GET"),
    ("/chat/completions", chat_completions, "POST"),
    ("/completions", completions, "POST"),
]
ROUTES = [
    Route(prefix + path, endpoint, methods=[method])
    for prefix in ("/v1", "")
    for path, endpoint, method in _ROUTES
]
