"""From a request to prompt tokens: the GGUF's chat template, raw text, or fill-in-the-middle."""

from __future__ import annotations

from localspec.engine.llama import LlamaModel
from localspec.engine.templating import ChatTemplate, TemplateRenderer
from localspec.errors import UserInputError
from localspec.types import GenerationRequest

# Used only when a GGUF carries no chat template: plain role-prefixed turns.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def prompt_tokens(
    model: LlamaModel, request: GenerationRequest, renderer: TemplateRenderer | None = None
) -> list[int]:
    """Token ids for a request; raises UserInputError for a request the model cannot serve.

    Chat messages are rendered by `renderer` (a child process, within a budget), never in this
    thread; without one, by a renderer started for this call.
    """
    if request.suffix is not None:
        return fim_tokens(model, request.prompt or "", request.suffix)
    if request.messages:
        if renderer is None:
            with TemplateRenderer() as own:
                return prompt_tokens(model, request, own)
        return _tokenize_rendered(model, renderer.render(chat_template(model), request.messages))
    if request.prompt is None:
        raise UserInputError("the request has neither messages nor a prompt", param="messages")
    return _tokenize_rendered(model, request.prompt)


def chat_template(model: LlamaModel) -> ChatTemplate:
    """The model's own chat template (Jinja, as Transformers renders it), with its BOS and EOS texts."""
    source = model.meta("tokenizer.chat_template") or FALLBACK_TEMPLATE
    bos = model.token_text(_special(model, "tokenizer.ggml.bos_token_id"))
    eos = model.token_text(_special(model, "tokenizer.ggml.eos_token_id"))
    return ChatTemplate(source, bos, eos, model.path.name)


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
