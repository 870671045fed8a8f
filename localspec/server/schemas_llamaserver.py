"""llama-server's own bodies, `/infill` (llama.vim, llama.vscode) and `/completion`, as engine requests.

llama-server's own sampling defaults apply (temperature 0.8, top-k 40, top-p 0.95,
min-p 0.05, no repetition penalty); `samplers` names the ones that run, so a chain without "temperature"
samples the truncated distribution as it is, as llama-server's chain does.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from localspec.errors import UserInputError
from localspec.server.schemas import (
    MAX_STOP,
    LogitBias,
    Penalties,
    SpeculativeOptions,
    _Body,
    logit_bias_pairs,
    spec_params,
    stop_strings,
)
from localspec.server.toolschemas import OutputConstraints
from localspec.types import MAX_TOP_LOGPROBS, FileChunk, GenerationRequest, SamplingParams, SpecParams

# llama-server's sampler names (and one-letter forms) that localspec applies; the rest are
# accepted and have no effect here ("infill" merges tokens sharing a prefix; localspec does not).
_APPLIED = {"top_k": "top_k", "k": "top_k", "top_p": "top_p", "p": "top_p", "min_p": "min_p", "m": "min_p",
            "temperature": "temperature", "t": "temperature",
            "penalties": "penalties", "e": "penalties"}  # fmt: skip
_ACCEPTED = {"infill", "i", "typ_p", "typical_p", "y", "xtc", "x", "dry", "d",
             "top_n_sigma", "s"}  # fmt: skip
MAX_EXTRA_CHUNKS = 256
# Far past any context served, and bounded so one request cannot hold the daemon's memory.
MAX_TOKENIZE_CHARS = 4_000_000
MAX_DETOKENIZE_TOKENS = 1_000_000


class ExtraChunk(_Body):
    """One piece of another file; llama.vim adds a `time` that only it reads."""

    text: str
    filename: str = "tmp"


class LlamaServerBody(Penalties, OutputConstraints):
    """What /infill and /completion share: llama-server's generation and sampling fields."""

    model: str | None = None
    n_predict: int = Field(-1, ge=-1, description="-1: until EOS or a full context; 0: warm the cache.")
    t_max_predict_ms: int = Field(0, ge=0, description="Stop at a newline once generation ran this long.")
    t_max_prompt_ms: int | None = Field(None, description="Accepted; llama-server ignores it too.")
    cache_prompt: bool = True
    samplers: list[str] | str | None = None
    temperature: float = Field(0.8, ge=0.0, le=5.0)
    top_k: int = Field(40, ge=0)
    top_p: float = Field(0.95, ge=0.0, le=1.0)
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] | None = Field(None, max_length=MAX_STOP)
    stream: bool = False
    return_progress: bool = Field(
        False,
        description="llama.cpp extension: with stream, chunks with nothing generated and a "
        "prompt_progress (total, cache, processed, time_ms) as the prompt is read, before the first token.",
    )
    response_fields: list[str] | None = Field(None, description="Only these (`a/b` for nested) fields.")
    n_cmpl: int = Field(1, ge=1, description="Completions per request; only 1.")
    n_indent: int = Field(0, ge=0, description="End before a new line indented less than this.")
    speculative: SpeculativeOptions | None = None
    n_probs: int = Field(
        0, ge=0, le=MAX_TOP_LOGPROBS, description="Each token's log-probability with this many alternatives."
    )
    post_sampling_probs: bool = Field(False, description="Only false: the model's own log-probabilities.")
    logit_bias: LogitBias | None = Field(None, description="[[token id, bias or false]] or {id: bias}.")
    ignore_eos: bool = Field(False, description="Generate past the end of the reply, to n_predict.")

    @model_validator(mode="after")
    def _one_completion(self) -> LlamaServerBody:
        if self.n_cmpl > 1:
            raise ValueError("only one completion per request is supported (n_cmpl 1)")
        if self.post_sampling_probs:
            raise ValueError(
                "post_sampling_probs is not supported: n_probs reports the model's own log-probabilities"
            )
        return self

    def sampler_names(self) -> set[str] | None:
        """The samplers that run, by their full names; None: llama-server's default chain (all)."""
        if self.samplers is None:
            return None
        names = list(self.samplers) if isinstance(self.samplers, str) else self.samplers
        unknown = [n for n in names if n not in _APPLIED and n not in _ACCEPTED]
        if unknown:
            raise UserInputError(f"unknown sampler {unknown[0]!r} in samplers", param="samplers")
        return {_APPLIED[n] for n in names if n in _APPLIED}

    def sampling(self) -> SamplingParams:
        on = self.sampler_names()
        runs = lambda name: on is None or name in on  # noqa: E731
        seed = self.seed if self.seed is not None and self.seed >= 0 else None
        return SamplingParams(
            # Without a temperature sampler the chain samples at 1, the distribution as it is.
            temperature=self.temperature if runs("temperature") else 1.0,
            top_k=self.top_k if runs("top_k") else 0,
            top_p=self.top_p if runs("top_p") else 1.0,
            min_p=self.min_p if runs("min_p") else 0.0,
            seed=seed,
            logit_bias=logit_bias_pairs(self.logit_bias),
            **(self.penalties() if runs("penalties") else {}),
        )

    def common(self, spec: SpecParams, unlimited: int) -> dict[str, Any]:
        """The GenerationRequest fields every llama-server body fills alike."""
        schema, grammar = self.constraint()
        return {
            "json_schema": schema,
            "grammar": grammar,
            "ignore_eos": self.ignore_eos,
            "max_tokens": unlimited if self.n_predict < 0 else self.n_predict,
            "time_limit_s": self.t_max_predict_ms / 1000 if self.t_max_predict_ms > 0 else None,
            "min_indent": self.n_indent,
            "stop": stop_strings(self.stop),
            "sampling": self.sampling(),
            "speculative": spec_params(self.speculative, spec),
            "cache_prompt": self.cache_prompt,
            "logprobs": self.n_probs or None,
            "progress": self.stream and self.return_progress,
        }


class InfillBody(LlamaServerBody):
    """POST /infill: code completion at the cursor, as llama-server takes it."""

    input_prefix: str = Field("", description="The file's text before the cursor's line (or all of it).")
    prompt: str = Field("", description="Text after input_prefix, before the cursor (the current line).")
    input_suffix: str = Field("", description="The file's text after the cursor.")
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)


class NativeCompletionBody(LlamaServerBody):
    """POST /completion: llama-server's raw-prompt completion (Continue's llama.cpp provider uses it)."""

    prompt: str = Field(..., description="The raw prompt; no chat template is applied.")


def infill_request(body: InfillBody, spec: SpecParams, unlimited: int) -> GenerationRequest:
    """The cursor's text as a fill-in-the-middle request; the current line continues the prefix."""
    extra = tuple(FileChunk(c.filename, c.text) for c in body.input_extra)
    return GenerationRequest(
        prompt=body.input_prefix + body.prompt,
        suffix=body.input_suffix,
        extra=extra,
        **body.common(spec, unlimited),
    )


def completion_request(body: NativeCompletionBody, spec: SpecParams, unlimited: int) -> GenerationRequest:
    return GenerationRequest(prompt=body.prompt, **body.common(spec, unlimited))


def pick_fields(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's `response_fields`: only the named fields, nested ones keyed by their path."""
    if fields is None:
        return body
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


class TokenizeBody(_Body):
    """POST /tokenize: text in the model's tokens, as llama-server answers it (`content`), or as
    vLLM does (`prompt`, `add_special_tokens`; lm-evaluation-harness's remote tokenizer sends these)."""

    content: str | None = Field(None, max_length=MAX_TOKENIZE_CHARS)
    prompt: str | None = Field(None, max_length=MAX_TOKENIZE_CHARS, description="vLLM's name for content.")
    add_special: bool | None = Field(None, description="Add the model's BOS token where it adds one.")
    add_special_tokens: bool | None = Field(None, description="vLLM's name for add_special.")
    parse_special: bool = Field(True, description="Read special tokens' text (<|im_end|>) as those tokens.")
    with_pieces: bool = Field(False, description="Each token with its text: [{id, piece}].")
    model: str | None = None

    @property
    def vllm(self) -> bool:
        return self.content is None

    def text(self) -> str:
        text = self.content if self.content is not None else self.prompt
        if text is None:
            raise UserInputError("send the text to tokenize as content (or prompt)", param="content")
        return text

    def adds_special(self) -> bool:
        """Whether to add BOS: as asked under either name, else each dialect's default (vLLM: yes)."""
        asked = self.add_special if self.add_special is not None else self.add_special_tokens
        return self.vllm if asked is None else asked


class DetokenizeBody(_Body):
    """POST /detokenize: token ids back to text."""

    tokens: list[int] = Field(..., max_length=MAX_DETOKENIZE_TOKENS)
    model: str | None = None
