"""A typed client for the daemon, over its unix socket or TCP. The TUI and the CLI use it.

It speaks the daemon's OpenAI-compatible routes and returns localspec's own
types: a stream yields `TokenChunk`s and ends with one `GenerationResult`
whose stats are the engine's. Closing a stream early (leaving the loop, or
`close()` on the iterator) closes the connection, and the daemon cancels that
generation within one step; a StreamAbort does it from another thread, even
before the first chunk. No llama.cpp here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from localspec.client.loaded import LoadedModel
from localspec.client.streamabort import StreamAbort
from localspec.errors import DaemonError, LocalspecError, ModelNotFoundError, OverloadedError, UserInputError
from localspec.types import (
    ChatMessage,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    PromptProgress,
    SamplingParams,
    SpecParams,
    TokenChunk,
)

if TYPE_CHECKING:
    from localspec.settings import Settings

StreamEvent = TokenChunk | GenerationResult
# A generator, so callers can close() it: that closes the connection and cancels the generation.
EventStream = Generator[StreamEvent, None, None]
DEFAULT_MODEL = "localspec"  # the daemon's alias for whatever target it serves
_STATS_FIELDS = {f.name for f in dataclasses.fields(GenerationStats)}


@dataclass(frozen=True)
class Health:
    """What `GET /health` says; most fields are set only once the models are loaded."""

    status: str
    version: str = ""
    model: str | None = None
    target: str | None = None
    draft: str | None = None
    draft_error: str | None = None
    pick: str | None = None  # what pick-draft chose and why, when the daemon was given no draft
    methods: tuple[str, ...] = ()
    method: str | None = None
    k: int | None = None
    n_ctx: int | None = None
    exact: bool = False  # batch-invariant loading (--exact); else llama.cpp's own, identical up to rounding
    plain_prefill: bool = False  # prompts read by a plain copy of the weights (engine.prefill)
    gpu_offload: bool = False
    queue_depth: int = 0
    in_flight: int = 0
    uptime_s: float = 0.0
    error: str | None = None
    # The target's RPC workers (--rpc): {"endpoint", "up", "error"} each, checked at the request.
    rpc_workers: tuple[dict[str, Any], ...] = ()

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Health:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["methods"] = tuple(values.get("methods") or ())
        values["rpc_workers"] = tuple(values.get("rpc_workers") or ())
        return cls(**values)


class Client:
    """One connection pool to one daemon. Use as a context manager or call close()."""

    def __init__(
        self,
        socket_path: Path | None = None,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float | None = 600.0,
        model: str = DEFAULT_MODEL,
    ) -> None:
        """Over `socket_path`, or over TCP at `base_url` (e.g. http://127.0.0.1:8977); not both."""
        if (socket_path is None) == (base_url is None):
            raise ValueError("give exactly one of socket_path and base_url")
        self.socket_path = socket_path
        self.where = f"{socket_path}" if socket_path is not None else str(base_url)
        self.model = model
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.HTTPTransport(uds=str(socket_path)) if socket_path is not None else None
        self._http = httpx.Client(
            base_url=base_url or "http://localhost",
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )
        self._abortable: httpx.Client | None = None  # made on first use, see _abortable_http
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, settings: Settings | None = None) -> Client:
        """The daemon `localspec serve` would start with the same settings: its unix socket."""
        from localspec.paths import Paths
        from localspec.settings import load_settings

        settings = settings or load_settings()
        return cls(socket_path=settings.socket or Paths.from_env().socket_path, token=settings.token)

    def close(self) -> None:
        self._http.close()
        if self._abortable is not None:
            self._abortable.close()

    def _abortable_http(self) -> httpx.Client:
        """A pool without keep-alive: each abortable stream opens its own connection, so the
        trace extension sees (and StreamAbort can shut down) the socket it uses."""
        with self._lock:
            if self._abortable is None:
                limits = httpx.Limits(max_keepalive_connections=0)
                uds = str(self.socket_path) if self.socket_path is not None else None
                transport = httpx.HTTPTransport(uds=uds, limits=limits) if uds is not None else None
                self._abortable = httpx.Client(
                    base_url=self._http.base_url,
                    transport=transport,
                    headers=self._http.headers,
                    timeout=self._http.timeout,
                    limits=limits,
                )
            return self._abortable

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- plain requests -----------------------------------------------------------------

    def _check_socket(self) -> None:
        # Fail before connecting: httpcore leaks the socket of a refused unix connect (a ResourceWarning).
        if self.socket_path is not None and not self.socket_path.exists():
            raise DaemonError(f"no localspec daemon at {self.where}; start one with `localspec serve`")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        self._check_socket()
        try:
            response = self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        return response

    def _unreachable(self, exc: httpx.TransportError) -> DaemonError:
        if isinstance(exc, httpx.ConnectError):
            return DaemonError(f"no localspec daemon at {self.where}; start one with `localspec serve`")
        return DaemonError(f"the daemon at {self.where} did not answer: {exc}")

    def health_raw(self) -> dict[str, Any]:
        """`/health` as sent (answers 503 while loading; that is not an error here)."""
        data: dict[str, Any] = self._request("GET", "/health").json()
        return data

    def health(self) -> Health:
        return Health.from_dict(self.health_raw())

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.1) -> Health:
        """Poll /health until the models are loaded; DaemonError if loading fails or takes too long."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            if health.ready:
                return health
            if health.status == "failed":
                raise DaemonError(f"the daemon failed to load its models: {health.error}")
            if time.monotonic() > deadline:
                raise DaemonError(f"the daemon at {self.where} was not ready within {timeout:g}s")
            time.sleep(interval)

    def models(self) -> list[str]:
        """Every model the daemon serves (each loads on its first request), its default first."""
        response = self._request("GET", "/v1/models")
        _raise_for_error(response)
        return [m["id"] for m in response.json()["data"]]

    def loaded(self) -> list[LoadedModel]:
        """The models the daemon has loaded now (`/api/ps`), with their memory, draft and expiry."""
        response = self._request("GET", "/api/ps")
        _raise_for_error(response)
        return [LoadedModel.from_ps(m) for m in response.json()["models"]]

    def delete(self, name: str) -> None:
        """Delete model `name`'s files from the models folder (Ollama's /api/delete); the daemon
        unloads it once idle."""
        _raise_for_error(self._request("DELETE", "/api/delete", {"model": name}))

    def metrics(self) -> str:
        response = self._request("GET", "/metrics")
        _raise_for_error(response)
        return response.text

    # --- generation ---------------------------------------------------------------------

    def stream(self, request: GenerationRequest, abort: StreamAbort | None = None) -> EventStream:
        """Chunks as they are generated, then the result; chat when the request has messages.

        With `abort`, `abort.abort()` from any thread ends the stream at once (without a result).
        """
        self._check_socket()
        path, body = _request_body(request, self.model)
        texts: list[str] = []
        thoughts: list[str] = []
        ids: list[int] = []
        http = self._http if abort is None else self._abortable_http()
        extensions = None if abort is None else {"trace": abort.trace}
        try:
            with http.stream("POST", path, json=body, extensions=extensions) as response:
                if response.status_code != 200:
                    response.read()
                    _raise_for_error(response)
                for data in _sse_data(response.iter_lines()):
                    event = _event(data, texts, ids)
                    if isinstance(event, TokenChunk):
                        texts.append(event.text)
                        thoughts.append(event.reasoning)
                        ids.extend(event.token_ids)
                    if isinstance(event, GenerationResult):
                        event = dataclasses.replace(event, reasoning="".join(thoughts))
                    if event is not None:
                        yield event
                    if isinstance(event, GenerationResult):
                        return
        except httpx.TransportError as exc:
            if abort is not None and abort.aborted:
                return
            raise self._unreachable(exc) from None
        raise DaemonError("the daemon ended the stream without a result")

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run a request to the end; the result carries the text, token ids and stats."""
        for event in self.stream(request):
            if isinstance(event, GenerationResult):
                return event
        raise DaemonError("the daemon ended the stream without a result")  # pragma: no cover

    def chat_stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 1024,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        speculative: SpecParams | None = None,
        abort: StreamAbort | None = None,
        truncate: bool = False,
        progress: bool = False,
    ) -> EventStream:
        """`truncate`: where the conversation does not fit the context, its oldest messages are left
        out (the result's stats.dropped_messages says how many), as Ollama's chat does.
        `progress`: chunks with `progress` set, and nothing else, say how far the prompt's read has
        got before the first token."""
        request = _build(tuple(messages), None, None, max_tokens, sampling, stop, speculative)
        return self.stream(dataclasses.replace(request, truncate=truncate, progress=progress), abort)

    def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int = 1024,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        speculative: SpecParams | None = None,
    ) -> GenerationResult:
        return self.generate(_build(tuple(messages), None, None, max_tokens, sampling, stop, speculative))

    def complete_stream(
        self,
        prompt: str,
        *,
        suffix: str | None = None,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        speculative: SpecParams | None = None,
    ) -> EventStream:
        """Raw-prompt completion; with `suffix`, fill-in-the-middle."""
        return self.stream(_build((), prompt, suffix, max_tokens, sampling, stop, speculative))

    def complete(
        self,
        prompt: str,
        *,
        suffix: str | None = None,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        speculative: SpecParams | None = None,
    ) -> GenerationResult:
        return self.generate(_build((), prompt, suffix, max_tokens, sampling, stop, speculative))


def _build(
    messages: tuple[ChatMessage, ...],
    prompt: str | None,
    suffix: str | None,
    max_tokens: int,
    sampling: SamplingParams | None,
    stop: Sequence[str],
    speculative: SpecParams | None,
) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        prompt=prompt,
        suffix=suffix,
        max_tokens=max_tokens,
        stop=tuple(stop),
        sampling=sampling or SamplingParams(),
        speculative=speculative or SpecParams(),
    )


def _request_body(request: GenerationRequest, model: str) -> tuple[str, dict[str, Any]]:
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "seed": s.seed,
        "repeat_penalty": s.repeat_penalty,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "repeat_last_n": s.repeat_last_n,
        # A banned token (-inf) as llama-server's `false`: JSON has no infinity.
        "logit_bias": {str(t): (False if b == -math.inf else b) for t, b in s.logit_bias},
        "stop": list(request.stop),
        "stream": True,
        "speculative": {"method": request.speculative.method, "k": request.speculative.k},
    }
    if request.progress:
        body["return_progress"] = True
    if request.messages:
        body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
        if request.truncate:
            body["truncate"] = True
        return "/v1/chat/completions", body
    body["prompt"] = request.prompt or ""
    if request.suffix is not None:
        body["suffix"] = request.suffix
    return "/v1/completions", body


def _sse_data(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        data: dict[str, Any] = json.loads(payload)
        if "error" in data:
            raise _error(500, data["error"])
        yield data


def _event(data: dict[str, Any], texts: list[str], ids: list[int]) -> StreamEvent | None:
    choices = data.get("choices") or []
    if not choices:
        return None  # the usage-only frame
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish is not None:
        stats_data = {k: v for k, v in (data.get("localspec") or {}).items() if k in _STATS_FIELDS}
        reason: FinishReason = "length" if finish == "length" else "stop"
        return GenerationResult("".join(texts), tuple(ids), reason, GenerationStats(**stats_data))
    read = data.get("prompt_progress")
    if isinstance(read, dict):
        return TokenChunk("", (), progress=_progress(read))
    delta = choice.get("delta")
    text = (delta.get("content") if delta is not None else choice.get("text")) or ""
    reasoning = (delta or {}).get("reasoning_content") or ""  # a thinking model's
    extra = data.get("localspec") or {}
    return TokenChunk(
        text, tuple(extra.get("token_ids", ())), int(extra.get("from_draft", 0)), reasoning=reasoning
    )


def _progress(read: dict[str, Any]) -> PromptProgress:
    """llama-server's prompt_progress as the engine's (time_ms in seconds)."""
    return PromptProgress(
        int(read["total"]), int(read["cache"]), int(read["processed"]), float(read["time_ms"]) / 1000
    )


def _error(status: int, error: Any) -> LocalspecError:
    """The daemon's error as a localspec type, chosen by status and code (never by message text)."""
    if not isinstance(error, dict):
        return DaemonError(f"the daemon answered {status}: {error}")
    message = str(error.get("message", "unknown error"))
    code = error.get("code")
    param = error.get("param")
    if code == "overloaded":
        return OverloadedError(message)
    if code == "model_not_found":
        return ModelNotFoundError(message, param=param)
    if status in (401, 403):  # the request was fine; this client may not use that daemon
        refused = DaemonError(f"the daemon refused the request: {message}")
        refused.http_status = status
        return refused
    if 400 <= status < 500:
        err = UserInputError(message, param=param)
        err.http_status = status
        err.code = code
        return err
    return DaemonError(message)


def _raise_for_error(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error")
    except ValueError:
        error = response.text
    raise _error(response.status_code, error)
