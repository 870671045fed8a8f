"""From a request to prompt tokens: the GGUF's chat template, raw text, or fill-in-the-middle."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from localspec.engine.drafters.views import (
    PromptView,
    has_json_lines,
    has_numbered_lines,
    json_decoded,
    numbered_spans,
    skipped_tokens,
    view_texts,
)
from localspec.engine.llama import LlamaModel
from localspec.engine.templating import ChatTemplate, TemplateRenderer
from localspec.errors import UserInputError
from localspec.types import FileChunk, GenerationRequest, ToolSpec

# Used only when a GGUF carries no chat template: plain role-prefixed turns.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


@dataclass(frozen=True)
class PromptForms:
    """What the n-gram drafter needs to know of the forms a reply may copy the prompt in."""

    views: tuple[PromptView, ...] = ()
    skipped: frozenset[int] = frozenset()  # positions of the numbers of numbered lines


# A prompt no reply copies in another form.
NO_FORMS = PromptForms()
# The prompt's last tokens a prediction's view sets before it (see `prediction_view`): the turn's
# opening the reply starts after (`<|im_start|>assistant\n` is 3), with room for longer ones.
PREDICTION_LEAD = 8
# The most tokens of a prediction and its reply `prediction_matched` compares.
MATCH_LIMIT = 8192
# A prediction whose lines the request's texts hold this share of is looked up in the prompt alone.
PREDICTION_HELD = 0.9


def prompt_forms(
    model: LlamaModel, request: GenerationRequest, prompt: Sequence[int], json_reply: bool
) -> PromptForms:
    """The prompt's other forms a reply may copy (drafters/views.py), tokenized, and the positions
    a copy skips: built where the reply is JSON (`json_reply`: a grammar holds it to JSON), the
    request shows numbered lines, or it holds lines in a JSON string (a tool's JSON result, an
    earlier call's arguments) and the reply is not JSON (6 ms for 2,800 tokens on 2 cores);
    nothing otherwise."""
    texts = [m.content for m in request.messages] + [request.prompt or "", request.suffix or ""]
    texts += [chunk.text for chunk in request.extra]
    texts += [call.arguments for m in request.messages for call in m.tool_calls]
    numbered = any(has_numbered_lines(t) for t in texts)
    # Strings the request's own texts hold: a tool's description the template renders is not copied.
    decodes = not json_reply and any(has_json_lines(t) for t in texts)
    predicted = prediction_view(model, request.prediction, prompt, texts)
    if not json_reply and not numbered and not decodes:
        return PromptForms(predicted)
    pieces = [model.piece(t) for t in prompt]
    text = b"".join(pieces).decode("utf-8", errors="replace")
    spans = numbered_spans(text) if has_numbered_lines(text) else []
    decoded = json_decoded(text) if decodes else None
    views = tuple(
        PromptView(model.tokenize(form, add_special=False, parse_special=False), escaped)
        for form, escaped in view_texts(text, json_reply, spans, decoded.text if decoded else None)
    )
    # A copy skips the numbers, and a plain reply the escapes of the JSON strings it writes plainly.
    skips = sorted([*spans, *decoded.escapes]) if decoded else spans
    return PromptForms((*views, *predicted), skipped_tokens(pieces, text, skips))


def _held(prediction: str, texts: Sequence[str]) -> bool:
    """Whether nearly every non-blank line of `prediction` is a line of `texts` (stripped: a set's
    lookups, where searching each text for each line took time quadratic in a file's size)."""
    lines = [line.strip() for line in prediction.splitlines() if line.strip()]
    known = {line.strip() for text in texts for line in text.splitlines()}
    return sum(line in known for line in lines) >= PREDICTION_HELD * len(lines)


def prediction_matched(predicted: Sequence[int], reply: Sequence[int]) -> int:
    """How many of a prediction's tokens the reply has, in order: the matching blocks of a diff
    (difflib, as `diff` pairs lines). Milliseconds for a rewritten file; a pathological repetition
    of a few tokens in thousands costs up to a second, so both are counted to MATCH_LIMIT tokens."""
    matcher = difflib.SequenceMatcher(None, predicted[:MATCH_LIMIT], reply[:MATCH_LIMIT], autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


def prediction_view(
    model: LlamaModel, prediction: str | None, prompt: Sequence[int], texts: Sequence[str]
) -> tuple[PromptView, ...]:
    """The text a request predicts its reply will mostly repeat (OpenAI's Predicted Outputs) as a
    view to copy from: the prompt's last tokens, the prediction, the prompt's last tokens again.
    None where the request's `texts` already hold it: the context's own lookup copies it there.

    A view is looked up with the reply after it, as the context is. Where the reply begins, its
    context ends in the turn's opening, which the view holds before the prediction: the first
    lookup already drafts the prediction's start, and each next one the prediction after the reply
    so far. A file both in the prompt and predicted was looked up twice, and the two copies'
    drafts cost the seven code edits 4-11% of their speed on 4 of them (docs/benchmarks.md).
    """
    if not prediction or _held(prediction, texts):
        return ()
    lead = list(prompt[-PREDICTION_LEAD:])
    tokens = model.tokenize(prediction, add_special=False, parse_special=False)
    return (PromptView([*lead, *tokens, *lead]),)


def prompt_tokens(
    model: LlamaModel, request: GenerationRequest, renderer: TemplateRenderer | None = None
) -> list[int]:
    """Token ids for a request; raises UserInputError for a request the model cannot serve.

    Chat messages are rendered by `renderer` (a child process, within a budget), never in this
    thread; without one, by a renderer started for this call. An earlier exchange's tokens
    (`context_ids`) come first, the prompt's own BOS dropped after them.
    """
    tokens = _own_tokens(model, request, renderer)
    if not request.context_ids:
        return tokens
    if model.add_bos and tokens[:1] == [_bos(model)]:
        tokens = tokens[1:]
    return checked_ids(model, request.context_ids, "context") + tokens


def _own_tokens(
    model: LlamaModel, request: GenerationRequest, renderer: TemplateRenderer | None
) -> list[int]:
    if request.suffix is not None:
        tokens = fim_tokens(model, request.prompt or "", request.suffix)
        return _with_extra(model, tokens, request) if request.extra else tokens
    if request.messages:
        if renderer is None:
            with TemplateRenderer() as own:
                return _own_tokens(model, request, own)
        return _tokenize_rendered(model, rendered_chat(renderer, chat_template(model), request))
    if request.prompt_ids is not None:
        return checked_ids(model, request.prompt_ids, "prompt")
    if request.prompt is None:
        raise UserInputError("the request has neither messages nor a prompt", param="messages")
    return _tokenize_rendered(model, request.prompt)


# Ollama's cut of a prompt past the context (llm/llama_server.go): its first tokens (num_keep, 4, and
# a BOS) and its latest, with about half the context past them left for the reply (its runners
# shifted the context by half).
CUT_KEEP = 5


def cut_to_context(tokens: list[int], n_ctx: int) -> list[int]:
    """`tokens` as Ollama cuts a prompt the context cannot hold: its first CUT_KEEP and its latest,
    to about half the context; as they are where they fit (at most n_ctx - 1: one position is the
    first reply token's)."""
    if len(tokens) < n_ctx:
        return tokens
    keep = min(CUT_KEEP, n_ctx - 1)
    limit = n_ctx - max((n_ctx - keep) // 2, 1)
    return tokens[:keep] + tokens[len(tokens) - (limit - keep) :]


def checked_ids(model: LlamaModel, ids: Sequence[int], param: str, what: str | None = None) -> list[int]:
    """Token ids a client gave (a prompt, a context, ids to show, a logit bias's), each one of the
    model's: llama.cpp reads past its tables otherwise. `what` names them in the error (`param`)."""
    for i, token in enumerate(ids):
        if not 0 <= token < model.n_vocab:
            named = f"{param if what is None else what} token".lstrip()
            raise UserInputError(
                f"{named} {i} is {token}, outside this model's vocabulary of {model.n_vocab} "
                f"tokens (0-{model.n_vocab - 1}); tokenize with /tokenize",
                param=param,
            )
    return list(ids)


def chat_template(model: LlamaModel) -> ChatTemplate:
    """The model's own chat template (Jinja, as Transformers renders it), with its BOS and EOS texts."""
    source = model.meta("tokenizer.chat_template") or FALLBACK_TEMPLATE
    bos = model.token_text(_special(model, "tokenizer.ggml.bos_token_id"))
    eos = model.token_text(_special(model, "tokenizer.ggml.eos_token_id"))
    return ChatTemplate(source, bos, eos, model.path.name)


def rendered_chat(renderer: TemplateRenderer, template: ChatTemplate, request: GenerationRequest) -> str:
    """A chat request's messages as `template` renders them, with the tools it offers and its own
    template variables (chat_template_kwargs)."""
    return renderer.render(template, request.messages, offered_tools(request), request.template_kwargs)


def offered_tools(request: GenerationRequest) -> tuple[ToolSpec, ...]:
    """The tools the template renders: none when the request says the model may call none."""
    return request.tools if request.tool_choice != "none" else ()


def fim_tokens(model: LlamaModel, prefix: str, suffix: str) -> list[int]:
    """Prefix-suffix-middle order, as Qwen2.5-Coder and most FIM-trained models expect."""
    fim = model.fim_tokens()
    if fim is None:
        raise UserInputError(
            f"{model.path.name} has no fill-in-the-middle tokens; drop `suffix`", param="suffix"
        )
    pre, suf, mid = fim
    encode = lambda text: model.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    head = [_bos(model)] if model.add_bos else []
    return [*head, pre, *encode(prefix), suf, *encode(suffix), mid]


# The project name before the files: llama-server's, since the model was trained on some name.
REPO_NAME = "myproject"
# Between chunks when the model has no file separator, as llama-server writes it.
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


def repo_tokens(model: LlamaModel, chunks: Sequence[FileChunk]) -> list[int]:
    """Other files as repository-level FIM context (Qwen2.5-Coder's `<|repo_name|>`/`<|file_sep|>` form).

    `<|repo_name|>myproject\n<|file_sep|>a.py\n...text...<|file_sep|>filename\n`, the last
    separator opening the file being completed, as llama-server does it (format_infill).
    """
    rep, sep = model.fim_repo_tokens()
    encode = lambda text: model.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    out = [rep, *encode(REPO_NAME + "\n")] if rep is not None else []
    for chunk in chunks:
        out += [sep, *encode(chunk.filename + "\n")] if sep is not None else encode(SNIPPET_SEPARATOR)
        out += encode(chunk.text)
    if sep is not None:
        out += [sep, *encode("filename\n")]
    return out


def _with_extra(model: LlamaModel, fim: list[int], request: GenerationRequest) -> list[int]:
    """The FIM prompt after as much of the other files' context as fits, the newest (last) kept first."""
    extra = repo_tokens(model, request.extra)
    # Room for the answer: what was asked, but no more than half the context (no limit asks for all).
    reserve = min(request.max_tokens, model.n_ctx // 2)
    take = max(0, min(len(extra), model.n_ctx - len(fim) - reserve))
    head = 1 if model.add_bos else 0  # the BOS stays first; llama-server puts the files before it
    return [*fim[:head], *extra[len(extra) - take :], *fim[head:]]


def _tokenize_rendered(model: LlamaModel, text: str) -> list[int]:
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    # Templates often write the BOS text themselves; llama.cpp then adds a second BOS.
    if model.add_bos and len(tokens) > 1 and tokens[0] == tokens[1] == _bos(model):
        tokens = tokens[1:]
    return tokens


def _bos(model: LlamaModel) -> int:
    return _special(model, "tokenizer.ggml.bos_token_id")


def _special(model: LlamaModel, key: str) -> int:
    value = model.meta(key)
    return int(value) if value is not None and value.lstrip("-").isdigit() else -1
