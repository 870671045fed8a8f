"""The HTTP API's request bodies (OpenAI and Ollama shapes), their validation, and the OpenAPI schema.

Each body turns into one `GenerationRequest`; nothing here knows HTTP routing
or the engine. Unknown fields are ignored, as OpenAI and Ollama clients send
many the daemon has no use for; fields the daemon cannot honour (images)
are refused rather than silently dropped. Tool and structured-output
bodies are in `toolschemas`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from localspec.errors import UserInputError
from localspec.server.refusals import NO_AUDIO, NO_VISION, NO_WEB_SEARCH
from localspec.server.toolschemas import (
    ChatTool,
    OpenAIToolCall,
    OpenAIToolChoice,
    OutputConstraints,
    ResponseFormat,
    Tool,
    ollama_format_schema,
    tool_choice,
    tool_specs,
)
from localspec.types import (
    MAX_TOP_LOGPROBS,
    REPEAT_LAST_N,
    ChatMessage,
    GenerationRequest,
    Method,
    SamplingParams,
    SpecParams,
)

M = TypeVar("M", bound=BaseModel)
MAX_STOP = 16
MAX_CHOICES = 16  # n: each choice is a generation of its own, one after another
# Prompts in one /v1/completions request, times n: each a generation of its own, one after another
# (lm-evaluation-harness sends its batch as one request).
MAX_PROMPT_CHOICES = 64
OPENAI_COMPLETIONS_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
# Ollama's documented sampling defaults, so Ollama clients get the output they expect.
OLLAMA_DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.9)
# keep_alive as Ollama parses it: a plain number of seconds, or a Go duration ("5m", "1h30m", "-1s").
GO_DURATION = re.compile(r"^-?(\d+(\.\d+)?|(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+)$")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


LogitBias = dict[str, float | bool] | list[tuple[int, float | bool]]
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound; -100 bans a token in practice, `false` (llama-server's) outright


def logit_bias_pairs(value: LogitBias | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} or llama-server's [[token id, bias]] (bias false: banned) as pairs."""
    if not value:
        return ()
    items = list(value.items()) if isinstance(value, dict) else list(value)
    pairs: list[tuple[int, float]] = []
    for key, bias in items:
        try:
            token = int(key)
        except ValueError:
            raise UserInputError(
                f"logit_bias key {str(key)[:40]!r} is not a token id; name tokens by id", param="logit_bias"
            ) from None
        if bias is True:
            raise UserInputError("a logit_bias is a number, or false to ban the token", param="logit_bias")
        if bias is False:
            pairs.append((token, -math.inf))
            continue
        # Not NaN or an infinity (Python's JSON reads them): a logit past every other breaks sampling.
        if not -MAX_LOGIT_BIAS <= float(bias) <= MAX_LOGIT_BIAS:
            raise UserInputError(
                f"logit_bias {float(bias):g} for token {token} is outside -100..100", param="logit_bias"
            )
        pairs.append((token, float(bias)))
    return tuple(pairs)


class Penalties(_Body):
    """The repetition penalties, by llama.cpp's and OpenAI's names (see SamplingParams): OpenAI
    bodies, Ollama's options and llama-server's bodies all carry them."""

    repeat_penalty: float = Field(1.0, gt=0.0, le=100.0, description="1 = off; >1 penalises repeats.")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Per repeat of a token; 0 = off.")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Once per repeated token; 0 = off.")
    repeat_last_n: int = Field(
        REPEAT_LAST_N, ge=-1, description="How many of the latest tokens count; -1: all, 0: off."
    )

    def penalties(self) -> dict[str, Any]:
        return {
            "repeat_penalty": self.repeat_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "repeat_last_n": self.repeat_last_n,
        }


class SpeculativeOptions(_Body):
    """localspec's extension: which speculation to run for this request."""

    method: Method | None = Field(None, description="auto, none, draft, ngram or layerskip.")
    k: int | None = Field(
        None,
        ge=1,
        le=32,
        description="Most tokens drafted per step; caps auto too. Default: the daemon's -k, else 4 "
        "for a fixed method and auto's own maximum for auto.",
    )


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    """A content part; only text parts carry what this daemon reads."""

    type: str = "text"
    text: str | None = None

    def checked_text(self) -> str:
        if self.type in ("image_url", "input_audio", "file"):
            raise UserInputError(f"{self.type} content: {NO_VISION}", param="messages")
        if self.type != "text" or self.text is None:
            raise UserInputError(
                f"{self.type!r} content parts are not supported; send text", param="messages"
            )
        return self.text


class Prediction(_Body):
    """OpenAI's Predicted Outputs: text the reply is expected to repeat in large part."""

    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.checked_text() for p in self.content)


class OpenAIMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[OpenAIToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = Field(
        None, description="An assistant turn's reasoning, as a thinking model's reply carried it."
    )
    reasoning: str | None = Field(
        None, description="reasoning_content's other name (OpenRouter's, newer vLLM's)."
    )

    def to_message(self) -> ChatMessage:
        content = self.content
        text = "".join(p.checked_text() for p in content) if isinstance(content, list) else (content or "")
        calls = tuple(c.to_call() for c in self.tool_calls or ())
        # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
        role = "system" if self.role == "developer" else self.role
        reasoning = self.reasoning_content or self.reasoning or ""
        return ChatMessage(role, text, calls, self.tool_call_id, self.name, reasoning)


class _OpenAISampling(Penalties, OutputConstraints):
    model: str = Field(..., min_length=1, description="The loaded target's name, or `localspec`.")
    max_tokens: int | None = Field(None, ge=-1, description="-1 (llama.cpp): until the context is full.")
    n_predict: int | None = Field(
        None, ge=-1, description="llama.cpp extension: max_tokens' other name; 0 only reads the prompt."
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="llama.cpp extension; 0 = off.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="llama.cpp extension; 0 = off.")
    seed: int | None = Field(None, description="Fixed seed for reproducible sampling; negative = random.")
    stop: str | list[str] | None = Field(None, max_length=MAX_STOP)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices, generated one after another.")
    logit_bias: LogitBias | None = Field(None, description='{"token id": bias in -100..100} on the logits.')
    speculative: SpeculativeOptions | None = None
    cache_prompt: bool = Field(
        True,
        description="llama.cpp extension: false evaluates the prompt from scratch instead of reusing "
        "the cached prefix of the previous request (reproducible to the bit, and fair to time).",
    )
    return_progress: bool = Field(
        False,
        description="llama.cpp extension: with stream, chunks with nothing generated and a "
        "prompt_progress (total, cache, processed, time_ms) as the prompt is read, before the first token.",
    )
    ignore_eos: bool = Field(
        False, description="vLLM and llama.cpp extension: generate past the end of the reply, to max_tokens."
    )

    def sampling(self) -> SamplingParams:
        seed = self.seed if self.seed is not None and self.seed >= 0 else None
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            seed=seed,
            logit_bias=logit_bias_pairs(self.logit_bias),
            **self.penalties(),
        )

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        if self.max_tokens == 0:
            raise UserInputError("max_tokens must be at least 1 (or -1: no limit)", param="max_tokens")

    def limit(self, default: int, unlimited: int, first: int | None = None) -> int:
        """Tokens to generate: the first of `first`, max_tokens, n_predict given; negative = no limit."""
        given = next((n for n in (first, self.max_tokens, self.n_predict) if n is not None), None)
        if given is None:
            return default
        return unlimited if given < 0 else given


class ChatCompletionBody(_OpenAISampling):
    """POST /v1/chat/completions."""

    messages: list[OpenAIMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ChatTool] | None = Field(None, description="Functions, and custom tools (input as text).")
    tool_choice: OpenAIToolChoice | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="Unset: several calls where the model may call or not, one where it must call."
    )
    response_format: ResponseFormat | None = None
    functions: list[dict[str, Any]] | None = Field(None, description="Deprecated by OpenAI; use tools.")
    # Refused by name rather than ignored: a client that asked for them would take a plain reply for theirs.
    modalities: list[str] | None = Field(None, description='Only ["text"].')
    audio: dict[str, Any] | None = Field(None, description="Not supported: this daemon answers in text.")
    web_search_options: dict[str, Any] | None = Field(None, description="Not supported: no hosted tools.")
    prediction: Prediction | None = Field(
        None, description="Text the reply mostly repeats (a file rewritten): drafted from, never forced."
    )
    logprobs: bool = Field(False, description="Each token's log-probability in choices[].logprobs.")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="The most probable tokens beside each (with logprobs)."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description="vLLM and llama.cpp extension: extra variables for the chat template, such as "
        '{"enable_thinking": false} for a thinking model that may answer without reasoning (Qwen3).',
    )
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = Field(
        None,
        description="llama.cpp extension: `none` leaves a thinking model's <think>...</think> in the "
        "content; otherwise its reasoning comes apart, in reasoning_content.",
    )
    reasoning_effort: str | None = Field(
        None, description="Passed to the chat template as `reasoning_effort`, as vLLM does (gpt-oss reads it)"
    )
    truncate: bool = Field(
        False,
        description="localspec's: drop the oldest messages (system messages and the latest kept) where "
        "the conversation does not fit the context, as Ollama's /api/chat does; the count is in "
        "localspec.dropped_messages. Off: a prompt past the context is an error, as OpenAI's is.",
    )

    def logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        return kwargs

    def check_supported(self) -> None:
        super().check_supported()
        if self.audio is not None or any(m != "text" for m in self.modalities or ()):
            param = "audio" if self.audio is not None else "modalities"
            raise UserInputError(f"{param}: {NO_AUDIO}", param=param)
        if self.web_search_options is not None:
            raise UserInputError(f"web_search_options: {NO_WEB_SEARCH}", param="web_search_options")
        if self.top_logprobs and not self.logprobs:
            raise UserInputError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.functions:
            raise UserInputError(
                "`functions` is deprecated and not supported; send `tools`", param="functions"
            )


Prompt = str | list[StrictInt]  # text, or the model's token ids


class CompletionBody(_OpenAISampling):
    """POST /v1/completions; `suffix` makes it fill-in-the-middle. `prompt` is a text, token ids, or a
    list of either: each prompt's `n` choices follow the one before's, as OpenAI orders them."""

    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    suffix: str | None = None
    echo: bool = Field(
        False, description="The prompt before each choice's text; with logprobs, its tokens' scored too."
    )
    logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="Token log-probabilities, with this many alternatives."
    )
    best_of: int | None = Field(None, ge=1, description="Refused above n (vLLM dropped it too): ask for n.")

    def prompts(self) -> list[Prompt]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise UserInputError("prompt is an empty list; send a text or token ids", param="prompt")
        if isinstance(p[0], int):  # one prompt, as token ids
            return [[t for t in p if isinstance(t, int)]]
        return [q if isinstance(q, str) else list(q) for q in p]

    def check_supported(self) -> None:
        if not (self.echo and self.max_tokens == 0):  # echo alone: the prompt scored, nothing generated
            super().check_supported()
        if self.echo and self.suffix is not None:
            raise UserInputError("echo cannot be combined with suffix", param="echo")
        if self.best_of is not None and self.best_of > self.n:
            raise UserInputError(
                f"best_of {self.best_of} is not supported (it would generate {self.best_of} and return "
                f"{self.n}); ask for n={self.best_of} with logprobs and keep the best",
                param="best_of",
            )
        count = len(self.prompts())
        if count * self.n > MAX_PROMPT_CHOICES:
            raise UserInputError(
                f"{count} prompts x n={self.n} is more than the {MAX_PROMPT_CHOICES} "
                "generations one request may ask for; send fewer prompts per request",
                param="prompt",
            )


class OllamaOptions(Penalties):
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    num_predict: int | None = Field(None, ge=-2, description="-1 or -2: until the context is full.")
    stop: list[str] | None = Field(None, max_length=MAX_STOP)
    num_ctx: int | None = Field(
        None,
        ge=1,
        description="At most the context the daemon serves; a smaller one holds the prompt to it, as "
        "Ollama's does (cut to fit, or refused with `truncate: false`).",
    )

    def check_context(self, served: int) -> None:
        """A model is served at one context size; a request for a larger one cannot be met."""
        if self.num_ctx is not None and self.num_ctx > served:
            raise UserInputError(
                f"options.num_ctx {self.num_ctx} is larger than the {served}-token context this daemon "
                f"serves; ask for at most {served}, or restart it with --ctx {self.num_ctx}",
                param="options.num_ctx",
            )

    def context_limit(self, served: int) -> int | None:
        """The context the prompt must fit: num_ctx where it is below the served one."""
        return self.num_ctx if self.num_ctx is not None and self.num_ctx < served else None

    def sampling(self) -> SamplingParams:
        d = OLLAMA_DEFAULTS
        seed = self.seed if self.seed is not None and self.seed >= 0 else None
        return SamplingParams(
            temperature=d.temperature if self.temperature is None else self.temperature,
            top_k=d.top_k if self.top_k is None else self.top_k,
            top_p=d.top_p if self.top_p is None else self.top_p,
            min_p=d.min_p if self.min_p is None else self.min_p,
            seed=seed,
            **self.penalties(),
        )


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[OpenAIToolCall] | None = None
    tool_name: str | None = None

    thinking: str | None = Field(None, description="An assistant turn's reasoning, as a reply carried it.")

    def to_message(self) -> ChatMessage:
        calls = tuple(c.to_call() for c in self.tool_calls or ())
        return ChatMessage(self.role, self.content, calls, name=self.tool_name, reasoning=self.thinking or "")


class _OllamaBody(_Body):
    model: str = Field(..., min_length=1)
    stream: bool = Field(True, description="Ollama streams unless told not to.")
    options: OllamaOptions = Field(default_factory=lambda: OllamaOptions.model_validate({}))
    format: str | dict[str, Any] | None = Field(None, description='"json" or a JSON schema.')
    keep_alive: float | str | None = Field(
        None, description="Accepted (a number of seconds or a duration like 5m); the model stays loaded."
    )
    speculative: SpeculativeOptions | None = None
    logprobs: bool = Field(False, description="Each token's log-probability in `logprobs`.")
    top_logprobs: int = Field(
        0, ge=0, le=MAX_TOP_LOGPROBS, description="The most probable tokens beside each."
    )
    think: bool | Literal["low", "medium", "high", "max"] | None = Field(
        None,
        description="A thinking model's reasoning: in `thinking`, apart from the reply (true, or a level; "
        "the default for a model that thinks); false asks the template for a reply without it.",
    )

    def logprobs_asked(self) -> int | None:
        return self.top_logprobs if self.logprobs else None

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str) and not GO_DURATION.match(value.strip()):
            raise ValueError(f"{value!r} is neither a number of seconds nor a duration like 5m or 1h30m")
        return value

    def check_supported(self) -> None:
        pass


class OllamaChatBody(_OllamaBody):
    """POST /api/chat; no messages only loads the model, as in Ollama."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[Tool] | None = None
    truncate: bool = Field(
        True,
        description="Drop the oldest messages (system messages and the latest kept) where the "
        "conversation does not fit the context, as Ollama does; false: a clear error instead.",
    )

    def check_supported(self) -> None:
        super().check_supported()
        if any(m.images for m in self.messages):
            raise UserInputError(f"images: {NO_VISION}", param="messages")


class OllamaGenerateBody(_OllamaBody):
    """POST /api/generate; an empty prompt only loads the model, as in Ollama."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    raw: bool = False
    template: str | None = Field(
        None, description="Not supported (a Go template): raw takes a formatted prompt."
    )
    images: list[str] | None = None
    context: list[StrictInt] | None = Field(
        None, description="An earlier reply's `context`: that exchange's tokens, read before this prompt."
    )
    truncate: bool = Field(
        True,
        description="Leave out the context's oldest tokens where it and the prompt do not fit, as "
        "Ollama does; false: a clear error instead.",
    )

    def check_supported(self) -> None:
        super().check_supported()
        if self.images:
            raise UserInputError(f"images: {NO_VISION}", param="images")
        if self.template and not self.raw:  # refused, not ignored: the reply would follow another format
            raise UserInputError(
                "template: a prompt template of the request's own is not supported; the model's chat "
                "template is applied, or send raw: true with the prompt already formatted",
                param="template",
            )
        if self.context and self.raw:  # Ollama reads it only when it applies the template, too
            raise UserInputError(
                "context is not read with raw: true (a raw reply returns none); send the whole "
                "conversation in the prompt",
                param="context",
            )


class OllamaNamedBody(_Body):
    """A body naming one model; `name` is Ollama's older spelling of `model`."""

    model: str | None = None
    name: str | None = None

    def named(self) -> str:
        name = self.model or self.name
        if not name:
            raise UserInputError("model is required", param="model")
        return name


class OllamaShowBody(OllamaNamedBody):
    """POST /api/show."""


class OllamaDeleteBody(OllamaNamedBody):
    """DELETE /api/delete."""


def parse_body(raw: bytes, model: type[M]) -> M:
    """Validate a JSON body; malformed JSON and bad fields become UserInputError (400)."""
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError) as exc:
        raise UserInputError(f"malformed JSON body: {exc}", param=None) from None
    if not isinstance(data, dict):
        raise UserInputError("the request body must be a JSON object", param=None)
    try:
        # JSON may escape lone surrogates (\ud800); text must be UTF-8 before it reaches the tokenizer.
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise UserInputError("the body holds invalid Unicode (a lone surrogate escape)", param=None) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise UserInputError(f"invalid {param or 'body'}: {err['msg']}", param=param) from None


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    items = [stop] if isinstance(stop, str) else (stop or [])
    return tuple(s for s in items if s)  # an empty stop string would stop before the first token


def spec_params(options: SpeculativeOptions | None, default: SpecParams) -> SpecParams:
    if options is None:
        return default
    # A request naming only a method gets the daemon's k, or (None) that method's default.
    k = default.k if options.k is None else options.k
    return SpecParams(method=options.method or default.method, k=k)


def chat_request(body: ChatCompletionBody, spec: SpecParams, unlimited: int) -> GenerationRequest:
    """A chat completion as an engine request; no max_tokens means until the context is full."""
    body.check_supported()
    schema, grammar = body.constraint(body.response_format.output_schema() if body.response_format else None)
    return GenerationRequest(
        messages=tuple(m.to_message() for m in body.messages),
        max_tokens=body.limit(unlimited, unlimited, body.max_completion_tokens),
        stop=stop_strings(body.stop),
        sampling=body.sampling(),
        speculative=spec_params(body.speculative, spec),
        cache_prompt=body.cache_prompt,
        tools=tool_specs(body.tools),
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        json_schema=schema,
        grammar=grammar,
        ignore_eos=body.ignore_eos,
        logprobs=body.logprobs_asked(),
        prediction=body.prediction.text() if body.prediction else None,
        truncate=body.truncate,
        progress=body.stream and body.return_progress,
        template_kwargs=body.template_kwargs(),
        split_reasoning=body.reasoning_format != "none",
    )


def completion_requests(body: CompletionBody, spec: SpecParams, unlimited: int) -> list[GenerationRequest]:
    """One request per prompt (its `n` choices are made from it)."""
    body.check_supported()
    schema, grammar = body.constraint()
    common = GenerationRequest(
        suffix=body.suffix,
        max_tokens=body.limit(OPENAI_COMPLETIONS_MAX_TOKENS, unlimited),
        stop=stop_strings(body.stop),
        sampling=body.sampling(),
        speculative=spec_params(body.speculative, spec),
        cache_prompt=body.cache_prompt,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if body.echo else None,
        progress=body.stream and body.return_progress,
        json_schema=schema,
        grammar=grammar,
        ignore_eos=body.ignore_eos,
    )
    return [
        replace(common, prompt=p) if isinstance(p, str) else replace(common, prompt_ids=tuple(p))
        for p in body.prompts()
    ]


def _ollama_limit(options: OllamaOptions, unlimited: int) -> int:
    n = options.num_predict
    return unlimited if n is None or n <= 0 else n


def ollama_chat_request(body: OllamaChatBody, spec: SpecParams, unlimited: int) -> GenerationRequest:
    body.check_supported()
    body.options.check_context(unlimited)
    return GenerationRequest(
        messages=tuple(m.to_message() for m in body.messages),
        max_tokens=_ollama_limit(body.options, unlimited),
        stop=stop_strings(body.options.stop),
        sampling=body.options.sampling(),
        speculative=spec_params(body.speculative, spec),
        tools=tool_specs(body.tools),
        json_schema=ollama_format_schema(body.format),
        logprobs=body.logprobs_asked(),
        truncate=body.truncate,
        context_limit=body.options.context_limit(unlimited),
    )


def ollama_generate_request(body: OllamaGenerateBody, spec: SpecParams, unlimited: int) -> GenerationRequest:
    """As Ollama does: a suffix means fill-in-the-middle, `raw` the bare prompt, else the chat template."""
    body.check_supported()
    body.options.check_context(unlimited)
    prompt = body.prompt or ""
    common: dict[str, Any] = {
        "max_tokens": _ollama_limit(body.options, unlimited),
        "stop": stop_strings(body.options.stop),
        "sampling": body.options.sampling(),
        "speculative": spec_params(body.speculative, spec),
        "json_schema": ollama_format_schema(body.format),
        "logprobs": body.logprobs_asked(),
        "context_ids": tuple(body.context or ()),
        "truncate": body.truncate,
        "context_limit": body.options.context_limit(unlimited),
    }
    if body.suffix:
        return GenerationRequest(prompt=prompt, suffix=body.suffix, **common)
    if body.raw:
        return GenerationRequest(prompt=prompt, **common)
    system = (ChatMessage("system", body.system),) if body.system else ()
    return GenerationRequest(messages=(*system, ChatMessage("user", prompt)), **common)
