"""From a request to prompt tokens: the GGUF's chat template, raw text, or fill-in-the-middle."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from localspec.engine.llama import LlamaModel
from localspec.errors import UserInputError
from localspec.types import ChatMessage, FileChunk, GenerationRequest, ToolCall, ToolSpec

# Used only when a GGUF carries no chat template: plain role-prefixed turns.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def prompt_tokens(model: LlamaModel, request: GenerationRequest) -> list[int]:
    """Token ids for a request; raises UserInputError for a request the model cannot serve."""
    if request.suffix is not None:
        tokens = fim_tokens(model, request.prompt or "", request.suffix)
        return _with_extra(model, tokens, request) if request.extra else tokens
    if request.messages:
        tools = request.tools if request.tool_choice != "none" else ()
        return _tokenize_rendered(model, render_chat(model, request.messages, tools))
    if request.prompt is None:
        raise UserInputError("the request has neither messages nor a prompt", param="messages")
    return _tokenize_rendered(model, request.prompt)


def render_chat(model: LlamaModel, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> str:
    """Apply the model's own chat template (Jinja, as Transformers renders it), tools included."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = model.meta("tokenizer.chat_template") or FALLBACK_TEMPLATE
    bos = model.token_text(_special(model, "tokenizer.ggml.bos_token_id"))
    eos = model.token_text(_special(model, "tokenizer.ggml.eos_token_id"))
    formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
    try:
        turns: list[Any] = [_turn(m) for m in messages]
        specs: list[Any] = [_tool(t) for t in tools]
        return formatter(messages=turns, tools=specs or None).prompt
    except Exception as exc:  # templates raise their own errors (e.g. "roles must alternate")
        raise UserInputError(
            f"the model's chat template rejected the messages: {exc}", param="messages"
        ) from None


def _turn(message: ChatMessage) -> dict[str, Any]:
    """A message as Transformers passes it to templates: calls with their arguments as a dict."""
    turn: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [_call(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        turn["name"] = message.name
    return turn


def _call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:  # templates `tojson` the arguments: text that is not JSON stays text
        arguments = call.arguments
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _tool(tool: ToolSpec) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}
    return {"type": "function", "function": function}


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
