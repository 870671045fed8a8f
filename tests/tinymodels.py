"""Tiny GGUF models that llama.cpp really loads and runs, written by the tests.

Each is a 2-4 layer llama with n_embd 64 and a ~700-token SentencePiece-style
vocabulary (control tokens, the 256 byte-fallback tokens, and word pieces), so any
text tokenizes and detokenizes, a ChatML chat template applies, and greedy
decoding emits varied words and sometimes stops on `<|im_end|>`. A model loads
and generates 32 tokens in a few milliseconds, which keeps the engine tests fast
while still going through llama.cpp itself.

Weights are random but deterministic: every tensor draws from its own RNG seeded
by (seed, tensor name), so the same arguments give the same bytes, and a model
with fewer layers shares the layers it has with a deeper one of the same seed.
"""

from __future__ import annotations

import itertools
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gguf
import llama_cpp
import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
Dtype = Literal["f32", "f16", "q8_0"]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPACE = "\u2581"  # SentencePiece's visible space: "▁hello" is " hello"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Tool calls as Qwen2.5's template renders them (Hermes syntax), cut to what the tests need.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}"
    '{% endfor %}\n</tools>\nReturn <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n'
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    '{% for c in m.tool_calls or [] %}<tool_call>\n{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}'
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# A thinking model's template as Qwen3's works, cut to what the tests need: earlier turns' reasoning
# shown, and `enable_thinking` false closing an empty block in the prompt.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n"
    "{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
    "enable_thinking is false %}<think>\n\n</think>{% endif %}{% endif %}"
)
# As DeepSeek-R1's distills' template works: earlier turns' reasoning cut from their content, and the
# prompt opening the block, so the reply starts inside it.
OPENED_THINKING_TEMPLATE = (
    "{% for m in messages %}{% set content = m.content %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>{% endif %}"
)
# What the thinking model writes after a prompt's last token: after a template's "\n", all of it;
# after an opened block, from "▁hello"; after a closed one, from "▁python".
THINKING_SCRIPT = (
    "<0x0A>",
    THINK_OPEN,
    "\u2581hello",
    "\u2581world",
    THINK_CLOSE,
    "\u2581python",
    "\u2581function",
    IM_END,
)

# Words (with every "▁"-prefix of each, which SentencePiece merging needs to build
# them up from characters) that cover English chat and Python code prompts.
_WORDS = """the a an and or not is are was be to of in on at for with as by from this that it
    you we they he she i my your our what which who how why when where there here can will would
    should could do does did have has had make made get got go went see look use used write read
    code test model draft token text word line file data list value name type time fast slow
    good bad new old small big first last next one two three four five six seven eight nine ten
    hello world python function return import class def self print if else elif for while try
    except finally with lambda yield pass break continue true false none
    int str float dict set tuple len range open sort sum max min key keys items append"""
WORDS: tuple[str, ...] = tuple(_WORDS.split())

# A disjoint-looking word list for the model whose vocabulary must not match.
_OTHER_WORDS = """lorem ipsum dolor sit amet consectetur adipiscing elit sed eiusmod tempor incididunt
    labore dolore magna aliqua enim minim veniam quis nostrud exercitation ullamco laboris
    nisi aliquip commodo consequat duis aute irure reprehenderit voluptate velit esse cillum
    fugiat nulla pariatur excepteur sint occaecat cupidatat proident sunt culpa officia"""
OTHER_WORDS: tuple[str, ...] = tuple(_OTHER_WORDS.split())

CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

# Output logit biases by kind of piece, applied through a constant channel (see
# _output_matrix). Bytes and control tokens are pushed down and whole words up, so
# greedy text reads as words; the EOS bias is tuned so that some greedy runs of a
# few dozen tokens end on their own.
SUPPRESS_BIAS = -20.0
FRAGMENT_BIAS = -8.0
CHAR_BIAS = -6.0
WORD_BIAS = 0.0
DEFAULT_EOS_BIAS = 2.0
ENDLESS_EOS_BIAS = -60.0
CONST_CHANNEL = 4.0
# Channel 0 after the final RMS norm: CONST_CHANNEL / rms(residual), measured ~3.5.
CONST_AFTER_NORM = 3.5
OUT_SCALE = 0.5

TokenType = gguf.TokenType
_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
_TENSOR_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}


@dataclass(frozen=True)
class TinyVocab:
    """A SentencePiece ("llama") vocabulary: pieces, merge scores and token types."""

    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    # How much the tiny model favours emitting each piece (an output logit bias), so
    # that greedy text is mostly whole words rather than word fragments and bytes.
    emit_bias: tuple[float, ...]

    def id(self, piece: str) -> int:
        """The id of `piece`; KeyError when absent."""
        try:
            return self.tokens.index(piece)
        except ValueError:
            raise KeyError(piece) from None

    def __len__(self) -> int:
        return len(self.tokens)


def build_vocab(
    words: Sequence[str] = WORDS,
    *,
    extra_tokens: Sequence[str] = (IM_START, IM_END),
    pieces: Sequence[str] = (),
    user_tokens: Sequence[str] = (),
) -> TinyVocab:
    """<unk> <s> </s>, the 256 byte tokens, characters, word pieces, then `extra_tokens` as control tokens.

    `pieces` are extra normal pieces added verbatim (use "▁" for a leading space); `user_tokens`
    are added tokens that render as text (as Qwen3's `<think>` is: not special).
    """
    entries: list[tuple[str, float, int, float]] = [
        ("<unk>", 0.0, TokenType.UNKNOWN, SUPPRESS_BIAS),
        ("<s>", 0.0, TokenType.CONTROL, SUPPRESS_BIAS),
        ("</s>", 0.0, TokenType.CONTROL, SUPPRESS_BIAS),
    ]
    entries += [(f"<0x{b:02X}>", 0.0, TokenType.BYTE, SUPPRESS_BIAS) for b in range(256)]
    # piece -> emit bias; dict keeps first-seen order, which sets the merge scores.
    normal: dict[str, float] = dict.fromkeys([SPACE, *CHARS], CHAR_BIAS)
    for word in words:
        spaced = SPACE + word
        for end in range(2, len(spaced)):
            normal.setdefault(spaced[:end], FRAGMENT_BIAS)
        normal[spaced] = WORD_BIAS
    for piece in pieces:
        normal[piece] = WORD_BIAS
    # SentencePiece merges the highest-scoring pair first; earlier pieces count as more frequent.
    entries += [(p, -float(i), TokenType.NORMAL, b) for i, (p, b) in enumerate(normal.items())]
    entries += [(t, 0.0, TokenType.CONTROL, SUPPRESS_BIAS) for t in extra_tokens]
    entries += [(t, 0.0, TokenType.USER_DEFINED, SUPPRESS_BIAS) for t in user_tokens]
    return TinyVocab(
        tokens=tuple(e[0] for e in entries),
        scores=tuple(e[1] for e in entries),
        types=tuple(int(e[2]) for e in entries),
        emit_bias=tuple(e[3] for e in entries),
    )


@dataclass(frozen=True)
class _Dims:
    n_vocab: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int

    @property
    def n_embd_kv(self) -> int:
        return self.n_embd // self.n_head * self.n_head_kv


def write_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    n_layers: int = 3,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 2048,
    vocab: TinyVocab | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    add_bos: bool = True,
    add_eos: bool = False,
    chat_template: str | None = CHATML_TEMPLATE,
    dtype: Dtype = "f32",
    eos_bias: float = DEFAULT_EOS_BIAS,
    noise: float = 0.0,
    noise_seed: int = 1,
    per_layer_arrays: bool = False,
    name: str = "tiny",
    basename: str | None = None,
    size_label: str | None = None,
    split_max_tensors: int = 0,
    script: Sequence[str] = (),
) -> Path:
    """Write a tiny llama GGUF at `path` (atomically) and return `path`.

    `script`: pieces the model writes one after another, greedily: after each, the next (the
    last one's successor is whatever the biases favour, the end token). Its layers then write
    nothing, so each choice depends on the current token alone, and a piece may appear once.

    `split_max_tensors`: split it as gguf-py splits a model, at most that many tensors a part, into
    PATH-STEM-00001-of-0000N.gguf and on beside `path` (not at `path`); returns part 1's path.

    `eos_id` defaults to `<|im_end|>` when the vocabulary has it (else `</s>`), so chat
    turns end the way real ChatML models end them. `noise` adds
    noise * N(0, 1) * (each tensor's own scale) drawn from `noise_seed`: a related model
    whose predictions mostly, not always, agree with the noise-free one.
    `per_layer_arrays` writes the head counts and feed-forward size as one value per
    layer, the form some architectures use.
    """
    vocab = vocab or build_vocab()
    bos = 1 if bos_id is None else bos_id
    eos = _default_eos(vocab) if eos_id is None else eos_id
    dims = _Dims(len(vocab), n_embd, n_head, n_head_kv, n_ff)
    tensors = _tensors(dims, n_layers, vocab, eos, seed, eos_bias, noise, noise_seed)
    if script:
        _follow_script(tensors, n_layers, [vocab.id(piece) for piece in script])

    writer = gguf.GGUFWriter(path=None, arch="llama", split_max_tensors=split_max_tensors)
    writer.add_name(name)
    if basename is not None:
        writer.add_basename(basename)
    if size_label is not None:
        writer.add_size_label(size_label)
    writer.add_file_type(_FILE_TYPES[dtype])
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    if per_layer_arrays:
        writer.add_feed_forward_length([n_ff] * n_layers)
        writer.add_head_count([n_head] * n_layers)
        writer.add_head_count_kv([n_head_kv] * n_layers)
    else:
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab))
    _add_tokenizer(writer, vocab, bos, eos, add_bos, add_eos, chat_template)
    for tensor_name, data in tensors.items():
        # Norm vectors stay f32, as converted and quantized models keep them.
        qtype = _TENSOR_TYPES[dtype] if data.ndim == 2 else gguf.GGMLQuantizationType.F32
        writer.add_tensor(tensor_name, gguf.quantize(data, qtype), raw_dtype=qtype)

    if split_max_tensors:  # the writer names the parts after `path`
        _write(writer, path)
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write(writer, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write(writer: gguf.GGUFWriter, path: Path) -> None:
    try:
        writer.write_header_to_file(path=path)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def _default_eos(vocab: TinyVocab) -> int:
    try:
        return vocab.id(IM_END)
    except KeyError:
        return 2


def _add_tokenizer(
    writer: gguf.GGUFWriter,
    vocab: TinyVocab,
    bos: int,
    eos: int,
    add_bos: bool,
    add_eos: bool,
    chat_template: str | None,
) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_eot_token_id(eos)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _tensors(
    dims: _Dims,
    n_layers: int,
    vocab: TinyVocab,
    eos: int,
    seed: int,
    eos_bias: float,
    noise: float,
    noise_seed: int,
) -> dict[str, F32]:
    def draw(name: str, shape: tuple[int, ...], scale: float) -> F32:
        data = _rng(seed, name).standard_normal(shape) * scale
        if noise:
            data = data + _rng(noise_seed, name).standard_normal(shape) * scale * noise
        return data.astype(np.float32)

    d, kv, ff = dims.n_embd, dims.n_embd_kv, dims.n_ff
    embd = draw("token_embd.weight", (dims.n_vocab, d), 1.0)
    embd[:, 0] = CONST_CHANNEL
    out: dict[str, F32] = {
        "token_embd.weight": embd,
        "output_norm.weight": np.ones(d, dtype=np.float32),
        "output.weight": _output_matrix(
            draw("output.weight", (dims.n_vocab, d), OUT_SCALE), vocab, eos, eos_bias
        ),
    }
    for i in range(n_layers):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = np.ones(d, dtype=np.float32)
        out[p + "attn_q.weight"] = draw(p + "attn_q.weight", (d, d), 2.0 / np.sqrt(d))
        out[p + "attn_k.weight"] = draw(p + "attn_k.weight", (kv, d), 2.0 / np.sqrt(d))
        out[p + "attn_v.weight"] = draw(p + "attn_v.weight", (kv, d), 1.0 / np.sqrt(d))
        out[p + "attn_output.weight"] = _no_const(draw(p + "attn_output.weight", (d, d), 1.0 / np.sqrt(d)))
        out[p + "ffn_norm.weight"] = np.ones(d, dtype=np.float32)
        out[p + "ffn_gate.weight"] = draw(p + "ffn_gate.weight", (ff, d), 1.0 / np.sqrt(d))
        out[p + "ffn_up.weight"] = draw(p + "ffn_up.weight", (ff, d), 1.0 / np.sqrt(d))
        out[p + "ffn_down.weight"] = _no_const(draw(p + "ffn_down.weight", (d, ff), 1.0 / np.sqrt(ff)))
    return out


# The logit a scripted transition adds (random logits and biases stay within about +-12).
SCRIPT_LOGIT = 60.0


def _follow_script(tensors: dict[str, F32], n_layers: int, script: Sequence[int]) -> None:
    """Make the model write `script`: no layer adds to the residual, so after the final norm it is
    the current token's own embedding, and each piece's output row gains SCRIPT_LOGIT along its
    predecessor's embedding (the constant channel left out, which every embedding shares)."""
    if len(set(script)) != len(script):
        raise ValueError("a scripted piece may appear once: the model sees only the current token")
    for i in range(n_layers):
        tensors[f"blk.{i}.attn_output.weight"][:] = 0.0
        tensors[f"blk.{i}.ffn_down.weight"][:] = 0.0
    embd, out = tensors["token_embd.weight"], tensors["output.weight"]
    for current, following in itertools.pairwise(script):
        x = embd[current] / np.sqrt(np.mean(embd[current] ** 2))  # the final RMS norm, weights of one
        direction = x[1:] / np.dot(x[1:], x[1:])
        out[following, 1:] += SCRIPT_LOGIT * direction


def _no_const(m: F32) -> F32:
    # Layers never write channel 0, so it stays the constant the embedding put there.
    m[0, :] = 0.0
    return m


def _output_matrix(m: F32, vocab: TinyVocab, eos: int, eos_bias: float) -> F32:
    """Column 0 meets the constant channel, so it acts as a per-token logit bias.

    llama has no output bias tensor; this is the cheapest stand-in. The bias is only
    roughly the intended size, since the residual's norm varies with the context.
    """
    bias = np.array(vocab.emit_bias, dtype=np.float32)
    bias[eos] = eos_bias
    m[:, 0] = bias / CONST_AFTER_NORM
    return m


# The named models the engine tests share (conftest writes each once per session).
# Measured with greedy_agreement over 16 prompts x 64 tokens: the related draft agrees
# with the target on 68% of tokens, the useless draft on 1%, the perfect one on 100%.
RELATED_NOISE = 0.06


def write_target(path: Path) -> Path:
    """The target: 3 layers, seed 0."""
    return write_tiny_model(path, seed=0, n_layers=3, name="tiny-target")


def write_tool_target(path: Path) -> Path:
    """The target's weights with a template that takes tools: the related draft drafts for it."""
    return write_tiny_model(path, seed=0, n_layers=3, chat_template=HERMES_TEMPLATE, name="tiny-tools")


def write_thinking_target(path: Path, template: str = THINKING_TEMPLATE) -> Path:
    """A thinking model that writes "<think> hello world</think> python function" (THINKING_SCRIPT)."""
    return _write_scripted(path, template, THINKING_SCRIPT, (THINK_OPEN, THINK_CLOSE), "tiny-think")


# The thinking model with tools (Qwen3's way: Hermes calls after the reasoning), whose script opens a
# call after its reasoning: the grammar writes the call (and its end) from there.
THINKING_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    '\n</tools>\nReturn <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{% endif %}'
    + THINKING_TEMPLATE
)
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
THINKING_TOOLS_SCRIPT = (
    "<0x0A>",
    THINK_OPEN,
    "\u2581hello",
    THINK_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    IM_END,
)


def write_thinking_tools_target(path: Path) -> Path:
    """A thinking model that takes tools: "<think> hello</think><tool_call>", the call left to a grammar."""
    tags = (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    return _write_scripted(path, THINKING_TOOLS_TEMPLATE, THINKING_TOOLS_SCRIPT, tags, "tiny-think-tools")


def _write_scripted(path: Path, template: str, script: Sequence[str], tags: Sequence[str], name: str) -> Path:
    """A 2-layer model following `script`, whose `tags` are added tokens that render as text."""
    vocab = build_vocab(user_tokens=tags)
    return write_tiny_model(
        path, seed=0, n_layers=2, vocab=vocab, chat_template=template, script=script, name=name
    )


# gpt-oss's harmony format (engine.harmony), its markers as its GGUF has them: control tokens, of which
# llama.cpp renders <|channel|>, <|message|>, <|start|> and <|constrain|> as text, and ends a reply at
# <|return|> or <|call|>. Tools go to the template, as gpt-oss's puts them in a developer message; as
# gpt-oss's, it refuses a call's turn with both content and thinking.
HARMONY_MARKERS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
)
HARMONY_TEMPLATE = (
    "{% if reasoning_effort is defined %}<|start|>system<|message|>Reasoning: {{ reasoning_effort }}<|end|>"
    "{% endif %}"
    "{% if tools %}<|start|>developer<|message|># Tools\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|end|>{% endif %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.tool_calls and m.content and m.thinking %}{{ raise_exception('both content and thinking') }}"
    "{% endif %}"
    "{% if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif %}"
    "{% for c in m.tool_calls or [] %}<|start|>assistant to=functions.{{ c.function.name }}"
    "<|channel|>commentary json<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}"
    "{% if m.content %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{% endif %}"
    "{% elif m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary"
    "<|message|>{{ m.content | tojson }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}"
    "<|end|>{% endif %}{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def write_harmony_target(path: Path) -> Path:
    """A gpt-oss-like model that writes "<|channel|>analysis<|message|> hello world<|end|><|channel|>
    final<|message|> python function<|return|>" after its template's prompt (`<|start|>assistant`):
    its reasoning " hello world", its answer " python function". A piece is scripted once, so it writes its
    second channel and message markers as two plain pieces each (the same text), and no
    `<|start|>assistant` between its messages (gpt-oss does; engine.harmony reads a message's end
    either way). "assistant" is an added token, so a prompt always ends with the same one."""
    halves = ("<|chan", "nel|>", "<|mess", "age|>")
    vocab = build_vocab(
        extra_tokens=HARMONY_MARKERS, pieces=(*halves, "analysis", "final"), user_tokens=("assistant",)
    )
    script = ["assistant", "<|channel|>", "analysis", "<|message|>", "\u2581hello", "\u2581world", "<|end|>"]
    script += [*halves[:2], "final", *halves[2:], "\u2581python", "\u2581function", "<|return|>"]
    return write_tiny_model(
        path,
        seed=0,
        n_layers=2,
        vocab=vocab,
        eos_id=vocab.id("<|return|>"),
        chat_template=HARMONY_TEMPLATE,
        script=script,
        name="tiny-harmony",
    )


def write_endless_target(path: Path) -> Path:
    """The target's weights but for its end token, which it never picks: a reply goes on until
    its token limit or the context ends, for tests that stop one mid-way."""
    return write_tiny_model(path, seed=0, n_layers=3, eos_bias=ENDLESS_EOS_BIAS, name="tiny-endless")


def write_endless_tool_target(path: Path) -> Path:
    """The tool target never picking its end token: held to calls, it writes one after another."""
    return write_tiny_model(
        path,
        seed=0,
        n_layers=3,
        chat_template=HERMES_TEMPLATE,
        eos_bias=ENDLESS_EOS_BIAS,
        name="tiny-tools-endless",
    )


def write_perfect_draft(path: Path) -> Path:
    """The target's weights under another name: every drafted token is accepted."""
    return write_tiny_model(path, seed=0, n_layers=3, name="tiny-perfect-draft")


def write_useless_draft(path: Path) -> Path:
    """Same vocabulary, unrelated weights: drafts are almost never accepted."""
    return write_tiny_model(path, seed=101, n_layers=2, name="tiny-useless-draft")


def write_related_draft(path: Path) -> Path:
    """The target's weights plus noise: most, not all, drafts are accepted."""
    return write_tiny_model(path, seed=0, n_layers=3, noise=RELATED_NOISE, name="tiny-related-draft")


def write_other_vocab(path: Path) -> Path:
    """A model whose token list differs from the target's, so tokenizer checks must fail."""
    return write_tiny_model(path, seed=8, n_layers=2, vocab=build_vocab(OTHER_WORDS), name="tiny-other-vocab")


# Measuring models (used by the tests and to tune the constants above).


def greedy_continuation(llm: Any, prompt: Sequence[int], n_tokens: int) -> list[int]:
    """The target's greedy continuation of `prompt`: argmax of the raw logits, up to EOG.

    `llm` is a `llama_cpp.Llama` built with logits_all=True.
    """
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    llm.reset()
    llm.eval(list(prompt))
    out: list[int] = []
    for _ in range(n_tokens):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        llm.eval([token])
    return out


def greedy_agreement(draft: Any, prompt: Sequence[int], continuation: Sequence[int]) -> tuple[int, int]:
    """(agreed, total): positions where `draft`'s argmax, given the same prefix, is the target's token.

    This is the per-token acceptance of greedy speculative decoding.
    """
    draft.reset()
    draft.eval([*prompt, *continuation])
    start = len(prompt) - 1
    guesses = np.argmax(draft.scores[start : start + len(continuation)], axis=1)
    agreed = int(np.sum(guesses == np.asarray(continuation)))
    return agreed, len(continuation)
