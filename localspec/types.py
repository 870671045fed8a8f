"""Plain data shared by the engine, the daemon, the client and the TUI.

No llama.cpp, no HTTP, no Textual here: the TUI imports these through the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Method = Literal["auto", "none", "draft", "ngram", "layerskip"]
METHODS: tuple[Method, ...] = ("auto", "none", "draft", "ngram", "layerskip")
# "tool_calls": the output was one or more tool calls (GenerationResult.tool_calls).
FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]


@dataclass(frozen=True)
class ToolCall:
    """A function call the model wrote (or, in history, an earlier one): `arguments` is JSON text."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: `parameters` is its JSON schema (an object schema)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # The schema a call's arguments are held to where it says more than `parameters` shows the
    # model: a custom tool's grammar as its input's pattern (server.toolschemas.custom_tool_spec).
    held_to: Mapping[str, Any] | None = field(default=None, hash=False)

    def arguments_schema(self) -> dict[str, Any]:
        """What a call's arguments must be valid against (an object schema)."""
        return dict(self.held_to or self.parameters) or {"type": "object", "properties": {}}


# How tools may be used: "auto" (the model chooses), "none" (never), "required" (at least one
# call), NamedTool (exactly that function), or AllowedTools (calls to some of the tools only).
# required, named and allowed are enforced by a grammar.
ToolMode = Literal["auto", "none", "required"]


@dataclass(frozen=True)
class NamedTool:
    name: str


@dataclass(frozen=True)
class AllowedTools:
    """Calls to these of the request's tools only (OpenAI's allowed_tools), as `mode` says: "auto"
    (or none at all) or "required". The template still shows every tool, so the prompt an agent
    resends with a different set allowed keeps its cached prefix."""

    names: tuple[str, ...]
    mode: Literal["auto", "required"] = "auto"


ToolChoice = ToolMode | NamedTool | AllowedTools


def calls_optional(choice: ToolChoice) -> bool:
    """Whether the reply may be text with no call (auto, allowed_tools in its auto mode)."""
    return choice == "auto" or (isinstance(choice, AllowedTools) and choice.mode == "auto")


def parallel_calls(parallel: bool | None, choice: ToolChoice) -> bool:
    """Whether a reply may hold more than one call: as asked, or, unasked, where calls are optional."""
    return calls_optional(choice) if parallel is None else parallel


def callable_names(choice: ToolChoice) -> tuple[str, ...] | None:
    """The tools a call may name, where the choice narrows them (None: any of the request's)."""
    if isinstance(choice, NamedTool):
        return (choice.name,)
    return choice.names if isinstance(choice, AllowedTools) else None


@dataclass(frozen=True)
class ChatMessage:
    """One turn. An assistant turn may carry `tool_calls`; a `tool` turn answers `tool_call_id`."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # A thinking model's reasoning before this (assistant) turn's content, as the client sent it
    # back; templates that show it (or drop it from earlier turns) read `reasoning_content`.
    reasoning: str = ""


@dataclass(frozen=True)
class FileChunk:
    """Another file's text, context placed before a fill-in-the-middle prompt (llama-server's input_extra)."""

    filename: str
    text: str


# The most alternatives a request may ask to see beside each token's log-probability (OpenAI's and
# Ollama's bound).
MAX_TOP_LOGPROBS = 20
# How many of the latest tokens the repetition penalties look at, unless a request says (llama.cpp's
# and Ollama's default).
REPEAT_LAST_N = 64


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution is sampled. temperature 0 means greedy.

    The penalties are llama.cpp's: over the last `repeat_last_n` tokens (-1: every one; 0: none), a
    token seen there has its logit divided by `repeat_penalty` (multiplied where not positive) and
    lowered by its count times `frequency_penalty` plus `presence_penalty`, greedy decoding included.
    `logit_bias` is added before them, as llama.cpp's chain does.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = REPEAT_LAST_N
    # (token id, bias) pairs added to the logits first (OpenAI's logit_bias; -inf bans a token).
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether any repetition penalty changes the logits."""
        some = self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        return some and self.repeat_last_n != 0


# Tokens drafted per step by a fixed method (draft, ngram, layerskip) when the request names no k.
DEFAULT_K = 4


@dataclass(frozen=True)
class SpecParams:
    """Which speculation to run; k is the most tokens drafted per step.

    k None means the method's default: DEFAULT_K for a fixed method, and for auto the most its
    controller drafts (localspec.auto.costmodel.NGRAM_K_MAX for an n-gram copy, K_MAX for a draft
    model). An explicit k caps auto too.
    """

    method: Method = "auto"
    k: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: either chat `messages` (template applied) or a raw `prompt`.

    A `suffix` makes it fill-in-the-middle: `prompt` is the text before the cursor, and `extra`
    other files' text placed before it. `max_tokens` 0 only reads the prompt into the cache
    (an editor's warm-up). `time_limit_s` stops generation once it has run that long and has
    written a newline (llama-server's t_max_predict_ms: a completion ends on a whole line).
    `min_indent` ends the text before a new line indented by fewer spaces or tabs (llama-server's
    n_indent: a completion stays inside the block it started in).
    """

    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    # A raw prompt given as the model's token ids (OpenAI's completions take a list of ints): read
    # as given, no BOS added; `prompt` then goes unused.
    prompt_ids: tuple[int, ...] | None = None
    # An earlier exchange's tokens, read before this prompt (Ollama's `context` on /api/generate:
    # deprecated there, still sent by clients that keep a conversation that way).
    context_ids: tuple[int, ...] = ()
    # A chat request whose messages were already rendered into `prompt` (Engine.prepare): its reply
    # is still a chat reply, Markdown, where auto tells prose from fenced code.
    chat: bool = False
    suffix: str | None = None
    extra: tuple[FileChunk, ...] = ()
    max_tokens: int = 256
    time_limit_s: float | None = None
    min_indent: int = 0
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    speculative: SpecParams = field(default_factory=SpecParams)
    # Reuse the KV cache of the longest prefix shared with the previous request (chat turns).
    # Off, the prompt is evaluated from scratch: reproducible to the bit, as benchmarks need.
    cache_prompt: bool = True
    # Functions the model may call (rendered by its chat template; calls parsed from its output).
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    # More than one call in a reply; None, the request did not say: where the model is free to call
    # or not (auto), yes; where a grammar holds it to calls, one, as llama-server allows one unless
    # asked (a small model held to calls otherwise wrote call after call until max_tokens).
    parallel_tool_calls: bool | None = None
    # Generate past the end-of-generation tokens, to max_tokens (llama-server's and vLLM's
    # ignore_eos, what benchmarks of a fixed length ask for): each is banned as a logit_bias of
    # -inf bans a token. Not with a schema, a grammar or tools, which end where they are complete.
    ignore_eos: bool = False
    # Structured output: the text must be JSON valid against this schema ({} any JSON value,
    # {"type": "object"} any object). Enforced at every token, speculation included.
    json_schema: Mapping[str, Any] | None = field(default=None, hash=False)
    # Or a grammar of the request's own, in llguidance's Lark syntax (engine.constraint turns
    # llama-server's GBNF, vLLM's regular expressions and choices into it), enforced the same way.
    grammar: str | None = None
    # Text the reply is expected to repeat in large part (OpenAI's Predicted Outputs: a file
    # rewritten with a few changes): drafted from as the prompt is; the output is the target's alone.
    prediction: str | None = None
    # Report each generated token's log-probability with this many of the most probable tokens
    # beside it (0: the token's alone; at most MAX_TOP_LOGPROBS); None: none reported.
    logprobs: int | None = None
    # Score the prompt too (OpenAI completions' `echo` with `logprobs`): each prompt token's
    # log-probability after the tokens before it, with this many alternatives. The whole prompt is
    # read again for it (a cached prefix has no logits left); None: not asked.
    prompt_logprobs: int | None = None
    # A chat whose prompt and reply would not fit the context drops its oldest messages first, the
    # system messages and the latest kept (Ollama's /api/chat `truncate`; server.truncation), and
    # `dropped_messages` says how many went (reported in the stats). A prompt past the context on
    # its own (a single message, /api/generate's prompt) then loses its middle, as Ollama cuts it.
    truncate: bool = False
    dropped_messages: int = 0
    # Ollama's options.num_ctx where it is below the context the model is served at: the prompt
    # must fit this many tokens, cut to them as above where `truncate`, else refused, as Ollama
    # runs a model at num_ctx (its reply may run on past it, as Ollama's does by shifting its
    # context). None: the served context.
    context_limit: int | None = None
    # Stream how far the prompt's read has got (llama-server's `return_progress`): chunks with
    # `progress` set and nothing else, before the first token. A 10,000-token prompt takes a
    # minute to read on a CPU; without them a client sees nothing until the first token.
    progress: bool = False
    # Extra variables for the chat template (vLLM's and llama-server's chat_template_kwargs):
    # `enable_thinking` false asks a thinking model's template (Qwen3's) for a reply without it.
    template_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # A thinking model's chat reply comes split: its reasoning apart from its content
    # (engine.reasoning). False leaves `<think>...</think>` in the content, as written.
    split_reasoning: bool = True
    # The most tokens a thinking model's reasoning may take (Anthropic's thinking.budget_tokens):
    # past them a grammar closes the block and the answer follows. None: no bound.
    thinking_budget: int | None = None

    @property
    def parallel_calls(self) -> bool:
        """Whether a reply may hold more than one call (the grammar and the call filter agree)."""
        return parallel_calls(self.parallel_tool_calls, self.tool_choice)


@dataclass
class GenerationStats:
    """What one request did and cost. Times in seconds.

    `k` is the cap on tokens drafted per step that the request ran with (0: no drafting);
    `mean_k` the tokens drafted per step, over the steps that drafted any (after the policy's
    choice, the room left and a drafter stopping early); `method_steps` counts steps per drafter
    (`grammar`: steps that drafted what a constraint forced).
    """

    method: str = "none"
    k: int = 0
    mean_k: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    ttft_s: float = 0.0
    tokens_per_second: float = 0.0
    mean_itl_s: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    mean_accepted_length: float = 0.0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    target_s: float = 0.0
    draft_s: float = 0.0
    python_s: float = 0.0
    redecided: int = 0
    # Verified as one-token decoding rounds (the default), or loaded fast: identical up to rounding.
    exact: bool = True
    method_steps: dict[str, int] = field(default_factory=dict)
    fallback_reason: str | None = None
    # A request's prediction (Predicted Outputs): its tokens, and how many of them the reply has, in
    # order (OpenAI's accepted_prediction_tokens; the rest are its rejected ones).
    prediction_tokens: int = 0
    prediction_accepted: int = 0
    # The chat's oldest messages left out to fit the context (GenerationRequest.truncate).
    dropped_messages: int = 0
    # A prompt past the context on its own, its middle left out as Ollama cuts it (prompting.cut_to_context).
    dropped_tokens: int = 0
    # Of `tokens`, a thinking model's reasoning (its text's tokens; engine.reasoning).
    reasoning_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability where it was decided, under the target's own distribution: the
    log-softmax of its raw logits, before penalties, grammar, temperature and truncation (what
    llama-server and Ollama report). `top`: the most probable tokens there, most probable first.
    `text` is the token's bytes as text, a special token's name where it renders as nothing.
    `logprob` is None for a prompt's first token: nothing before it predicts it."""

    token: int
    text: str
    piece: bytes
    logprob: float | None
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class CallDelta:
    """A piece of a tool call being written (engine.callstream): its name in the first piece only,
    and what is new of its arguments' text (each piece a prefix of the arguments it ends with);
    `done` in the piece that completes them."""

    index: int
    name: str
    arguments: str
    done: bool = False


@dataclass(frozen=True)
class TokenChunk:
    """Text that became final in one step, with its token ids.

    `from_draft` counts how many of `token_ids` were drafted and accepted (the rest
    came from the target itself), for colouring and live acceptance stats. `logprobs`, one per
    token id, where the request asked for them.

    `prompt`: the chunk is the prompt scored (GenerationRequest.prompt_logprobs), sent before the
    first generated token: its ids are the prompt's, its text empty, its logprobs one per id.
    `progress`: the chunk says how far the prompt's read has got (GenerationRequest.progress), and
    has no text or tokens.
    """

    text: str
    token_ids: tuple[int, ...]
    from_draft: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt: bool = False
    progress: PromptProgress | None = None
    # A thinking model's reasoning that became final in this step (its content is in `text`).
    reasoning: str = ""
    # What is new of the tool calls being written, where calls stream (ToolCallFilter).
    calls: tuple[CallDelta, ...] = ()


@dataclass(frozen=True)
class PromptProgress:
    """How far a prompt's read has got: `processed` of its `total` tokens are in the cache, the
    first `cached` of them from an earlier request; `seconds` since the read began (pauses for
    other requests left out). llama-server's prompt_progress: total, cache, processed, time_ms."""

    total: int
    cached: int
    processed: int
    seconds: float


@dataclass(frozen=True)
class GenerationResult:
    """`text` is the content; tool calls the model wrote are in `tool_calls`, not in `text`."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stats: GenerationStats
    stop_string: str | None = None  # the request's stop string that ended it, if one did
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, where the request asked for them
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # one per prompt token, where asked
    prompt_ids: tuple[int, ...] = ()  # the prompt as the target read it
    reasoning: str = ""  # a thinking model's reasoning, apart from `text` (engine.reasoning)
    # A call the token limit cut short (finish_reason length): its name and the start of its
    # arguments, not JSON; in no history, and where an API can show a partial call, shown as one.
    cut_call: ToolCall | None = None

    def calls_shown(self) -> tuple[ToolCall, ...]:
        """The calls as a client is shown them: the reply's, then the one cut short."""
        return self.tool_calls + ((self.cut_call,) if self.cut_call is not None else ())
