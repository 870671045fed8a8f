"""What a GGUF file says about itself: metadata, tokenizer and tensor sizes, never its weights.

`read_gguf_info` reads only the header (`gguf_header`, a struct reader over a
memory map), so a 10 GB model costs what its metadata costs: about 0.1 s for a
150k-token vocabulary. Infos and token lists are also cached on disk
(`gguf_cache`), so a second scan of a folder of models only stats the files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import ModelFileError, UnsupportedModelError
from localspec.models.gguf_cache import GGUFCache, cache_key
from localspec.models.gguf_header import GGUFHeader, corrupt_at, ggml_type_name, read_header
from localspec.models.split import every_part, sibling_parts, split_part
from localspec.paths import Paths

GGUF_MAGIC = b"GGUF"
FINGERPRINT_HEX = 16

# fmt: off
# tokenizer.ggml.model -> llama.cpp's vocab type (llama-vocab.cpp, llama_vocab::impl::load).
_VOCAB_TYPES = {
    "llama": "spm", "gpt2": "bpe", "hybriddna": "bpe", "whitespace": "bpe", "gemma4": "bpe", "bert": "wpm",
    "t5": "ugm", "rwkv": "rwkv", "plamo2": "plamo2", "no_vocab": "none", "none": "none",
}
# llama.cpp's defaults when a GGUF does not say: (bos id, eos id, add_bos, add_eos).
_TOKENIZER_DEFAULTS: dict[str, tuple[int | None, int | None, bool, bool]] = {
    "spm": (1, 2, True, False), "bpe": (11, 11, False, False), "wpm": (101, None, True, False),
    "ugm": (None, 1, False, True), "rwkv": (None, None, False, False), "plamo2": (1, 2, False, False),
}
# BPE pre-tokenizers for which llama.cpp turns add_bos on by default.
_BPE_PRE_ADDS_BOS = frozenset([
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano",
    "tekken", "chameleon",
])
# Token texts llama.cpp recognises as fill-in-the-middle markers when no id is given.
_FIM_TEXTS = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
               "<|code_prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
               "<|code_suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
               "<|code_middle|>"),
}
# Architectures llama.cpp knows but that cannot generate text: encoders, embedders,
# vision projectors (mmproj files) and audio decoders.
_NOT_GENERATIVE = frozenset([
    "clip", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3",
    "eurobert", "t5encoder", "wavtokenizer-dec", "gemma-embedding",
])
# fmt: on
_FIM_KEYS = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
_ARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Far above any real model (context lengths reach ~10M, block counts a few hundred), and far
# below what would make the planner's arithmetic or lists blow up.
MAX_COUNT = 1 << 40
MAX_BLOCKS = 1 << 16


@dataclass(frozen=True)
class GGUFInfo:
    """One model file as its header describes it. Sizes in bytes, counts in tokens."""

    path: Path
    name: str
    arch: str
    n_params: int
    quant: str
    size_bytes: int
    n_ctx_train: int
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    vocab_type: str
    tokenizer_pre: str | None
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    has_chat_template: bool
    chat_template: str | None
    fim_prefix_id: int | None
    fim_suffix_id: int | None
    fim_middle_id: int | None
    tokenizer_fingerprint: str
    layer_bytes: tuple[int, ...]
    non_layer_bytes: int
    token_embd_bytes: int
    output_bytes: int
    # Bytes of the blocks' weight matrices by ggml type, (("Q4_K", n), ...): llama.cpp's CPU
    # backend copies some types into an interleaved layout, and the planner counts those copies.
    block_matrix_bytes: tuple[tuple[str, int], ...] = ()
    # general.basename, general.size_label and general.finetune ("Qwen2.5-Coder", "1.5B",
    # "Instruct"): what Ollama-style names (qwen2.5-coder:1.5b) are matched against.
    basename: str = ""
    size_label: str = ""
    finetune: str = ""

    @property
    def has_fim(self) -> bool:
        """True when prefix, suffix and middle markers all exist (code infill can work)."""
        return None not in (self.fim_prefix_id, self.fim_suffix_id, self.fim_middle_id)

    @property
    def llama_vocab_type(self) -> str:
        """The vocab type as llama.cpp compares it (spm, bpe, wpm, ugm, ...)."""
        return llama_vocab_type(self.vocab_type)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; `from_dict` reads it back."""
        data = dataclasses.asdict(self)
        data["path"] = str(self.path)
        data["layer_bytes"] = list(self.layer_bytes)
        data["block_matrix_bytes"] = [list(pair) for pair in self.block_matrix_bytes]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GGUFInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["path"] = Path(values["path"])
        values["layer_bytes"] = tuple(values["layer_bytes"])
        values["block_matrix_bytes"] = tuple(
            (str(t), int(n)) for t, n in values.get("block_matrix_bytes", ())
        )
        return cls(**values)


def llama_vocab_type(tokenizer_model: str) -> str:
    """Map `tokenizer.ggml.model` to llama.cpp's vocab type; unknown models map to themselves."""
    return _VOCAB_TYPES.get(tokenizer_model, tokenizer_model)


def read_gguf_info(path: str | os.PathLike[str], *, cache_dir: Path | None = None) -> GGUFInfo:
    """Describe the GGUF at `path` (cached); ModelFileError or UnsupportedModelError when unusable."""
    file, st = _check_file(Path(path))
    # A split model's parts are found by part 1's name as given: a Hugging Face cache links each
    # part's name in a snapshot folder to a blob named by its hash.
    named = Path(path).expanduser().absolute()
    cache = GGUFCache(cache_dir or Paths.from_env().cache_dir)
    key = _split_key(named, file, st)
    info = _from_cache(cache.load_info(key))
    if info is None:
        info, tokens = _parse(file, st, named)
        cache.store(key, info.to_dict(), info.tokenizer_fingerprint, tokens)
    _check_supported(info)
    # The path as named, not resolved, wherever the cached entry was read from: llama.cpp finds a
    # split model's other parts beside the name it is given, and a blob's hash is no model's name.
    return info if info.path == named else dataclasses.replace(info, path=named)


def check_model_file(path: Path, *, cache_dir: Path | None = None) -> None:
    """ModelFileError for a file that is no GGUF or whose header is corrupt, before llama.cpp reads it.

    An architecture this module does not recognise passes: llama.cpp has the last word on that.
    """
    with contextlib.suppress(UnsupportedModelError):
        read_gguf_info(path, cache_dir=cache_dir)


def read_tokens(info: GGUFInfo, *, cache_dir: Path | None = None) -> list[str]:
    """The token texts of `info`'s vocabulary, by id (cached by tokenizer fingerprint)."""
    cache = GGUFCache(cache_dir or Paths.from_env().cache_dir)
    tokens = cache.load_tokens(info.tokenizer_fingerprint)
    if tokens is not None:
        return tokens
    file, _ = _check_file(info.path)
    header = read_header(file)  # the vocabulary is part 1's, the file info.path names
    tokens = header.tokens
    if _tokenizer(header.metadata, tokens)["tokenizer_fingerprint"] != info.tokenizer_fingerprint:
        raise ModelFileError(f"{file}: the file changed since it was read; read it again")
    cache.store_tokens(info.tokenizer_fingerprint, tokens)
    return tokens


def _split_key(named: Path, file: Path, st: os.stat_result) -> str:
    """The cache key of `file`'s info: its own, and where it is `named` as part 1 of a split model,
    also the other parts' as they are now (one replaced or gone is read again)."""
    key = cache_key(file, st)
    if split_part(named.name) is None:
        return key
    others = []
    for part in sibling_parts(named)[1:]:
        try:
            others.append(cache_key(part, part.stat()))
        except OSError:
            others.append(f"missing {part.name}")
    return hashlib.sha256("\0".join([key, *others]).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _split_headers(file: Path, meta: Mapping[str, Any]) -> tuple[list[GGUFHeader], int]:
    """The headers of a split model's parts 2..n and their bytes, found beside its part 1 `file`
    (as named, not resolved; none for a model in one file); ModelFileError where a part is
    missing, or part 1 is not named as llama.cpp looks for the others."""
    count, number = meta.get("split.count"), meta.get("split.no", 0)
    if not isinstance(count, int) or count <= 1:
        return [], 0
    if number != 0:
        raise ModelFileError(f"{file}: is part {number + 1} of {count} of a split model; open its first part")
    headers, size = [], 0
    for index, part in enumerate(every_part(file, count)[1:], start=1):
        header = read_header(part)
        if header.metadata.get("split.no") != index or header.metadata.get("split.count") != count:
            raise ModelFileError(f"{part}: is not part {index + 1} of {count} of {file.name}'s model")
        headers.append(header)
        size += header.size
    return headers, size


def _from_cache(data: Mapping[str, Any] | None) -> GGUFInfo | None:
    if data is None:
        return None
    try:
        return GGUFInfo.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None  # an entry from another layout: parse the file again


def _check_file(path: Path) -> tuple[Path, os.stat_result]:
    """The resolved path and its stat, or one clear line saying why it is no GGUF file."""
    try:
        file = path.expanduser().resolve()
        st = file.stat()
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if file.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a GGUF file")
    try:
        with open(file, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    return file, st


def _parse(file: Path, st: os.stat_result, named: Path) -> tuple[GGUFInfo, list[str]]:
    header = read_header(file)
    meta = header.metadata
    parts, parts_size = _split_headers(named, meta)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{file}: has no general.architecture; not a model (a split part?)")
    if not _ARCH_NAME.fullmatch(arch):
        raise header.bad_value("general.architecture", "is not an architecture name")
    if meta.get("general.type") == "adapter":
        raise UnsupportedModelError(f"{file}: is a LoRA adapter, not a model")
    tokens = header.tokens
    tok = _tokenizer(meta, tokens)
    tensors = _tensor_sizes([header, *parts])
    n_embd = _int(header, f"{arch}.embedding_length")
    n_head = _int(header, f"{arch}.attention.head_count")
    head_dim = n_embd // n_head if n_head else 0
    info = GGUFInfo(
        path=named,
        name=str(meta.get("general.name") or named.stem),
        arch=arch,
        n_params=tensors.n_params,
        quant=_quant(meta, tensors.dominant_type),
        size_bytes=st.st_size + parts_size,
        n_ctx_train=_int(header, f"{arch}.context_length"),
        n_layers=_int(header, f"{arch}.block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=_int(header, f"{arch}.attention.head_count_kv") or n_head,
        head_dim_k=_int(header, f"{arch}.attention.key_length") or head_dim,
        head_dim_v=_int(header, f"{arch}.attention.value_length") or head_dim,
        layer_bytes=tensors.layer_bytes,
        non_layer_bytes=tensors.non_layer_bytes,
        token_embd_bytes=tensors.token_embd_bytes,
        output_bytes=tensors.output_bytes,
        block_matrix_bytes=tensors.block_matrix_bytes,
        basename=str(meta.get("general.basename") or ""),
        size_label=str(meta.get("general.size_label") or ""),
        finetune=str(meta.get("general.finetune") or ""),
        **tok,
    )
    return info, tokens


def _int(header: GGUFHeader, key: str) -> int:
    """A count from the header (0 when absent); for per-layer arrays (some hybrid models) the largest.

    A value no model can have (negative, infinite, not a number, past MAX_COUNT) makes the file corrupt.
    """
    value = header.metadata.get(key)
    values = value if isinstance(value, list) else [] if value is None else [value]
    counts = [_count(header, key, v) for v in values]
    return max(counts, default=0)


def _count(header: GGUFHeader, key: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise header.bad_value(key, f"is {value!r}, not a whole number")
    if not 0 <= value <= MAX_COUNT:
        raise header.bad_value(key, f"is {value:,}, out of range")
    return value


def _tokenizer(meta: Mapping[str, Any], tokens: list[str]) -> dict[str, Any]:
    """Tokenizer fields of GGUFInfo, with llama.cpp's defaults where the header is silent."""
    model = str(meta.get("tokenizer.ggml.model") or "none")
    pre = meta.get("tokenizer.ggml.pre")
    vtype = llama_vocab_type(model)
    bos, eos, add_bos, add_eos = _TOKENIZER_DEFAULTS.get(vtype, (None, None, False, False))
    if vtype == "bpe" and pre in _BPE_PRE_ADDS_BOS:
        add_bos = True
    bos = _token_id(meta, "tokenizer.ggml.bos_token_id", len(tokens), bos)
    eos = _token_id(meta, "tokenizer.ggml.eos_token_id", len(tokens), eos)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", add_eos))
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) and template else None
    fim = {part: _fim_id(meta, tokens, part) for part in ("prefix", "suffix", "middle")}
    return {
        "vocab_type": model,
        "tokenizer_pre": pre if isinstance(pre, str) else None,
        "vocab_size": len(tokens),
        "bos_id": bos,
        "eos_id": eos,
        "add_bos": add_bos,
        "add_eos": add_eos,
        "has_chat_template": template is not None,
        "chat_template": template,
        "fim_prefix_id": fim["prefix"],
        "fim_suffix_id": fim["suffix"],
        "fim_middle_id": fim["middle"],
        "tokenizer_fingerprint": tokenizer_fingerprint(model, tokens, bos, eos, add_bos, add_eos),
    }


def _token_id(meta: Mapping[str, Any], key: str, n_vocab: int, default: int | None) -> int | None:
    value = meta.get(key)
    # llama.cpp ignores ids outside the vocabulary ("bad special token") and keeps its default.
    if isinstance(value, int) and 0 <= value < n_vocab:
        return value
    return default


def _fim_id(meta: Mapping[str, Any], tokens: list[str], part: str) -> int | None:
    for key in _FIM_KEYS[part]:
        found = _token_id(meta, key, len(tokens), None)
        if found is not None:
            return found
    wanted = _FIM_TEXTS[part]
    # Control tokens sit at the end of big vocabularies; scanning from the end finds them fast.
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i] in wanted:
            return i
    return None


def tokenizer_fingerprint(
    vocab_type: str, tokens: list[str], bos: int | None, eos: int | None, add_bos: bool, add_eos: bool
) -> str:
    """A stable hash of everything llama.cpp's draft compatibility check looks at.

    Equal fingerprints imply compatible tokenizers; different ones need `compat` to decide.
    """
    h = hashlib.sha256()
    h.update(f"{llama_vocab_type(vocab_type)}\0{bos}\0{eos}\0{add_bos}\0{add_eos}\0{len(tokens)}\0".encode())
    for text in tokens:
        raw = text.encode("utf-8", "surrogateescape")
        h.update(len(raw).to_bytes(4, "little"))
        h.update(raw)
    return h.hexdigest()[:FINGERPRINT_HEX]


@dataclass(frozen=True)
class _TensorSizes:
    n_params: int
    layer_bytes: tuple[int, ...]
    non_layer_bytes: int
    token_embd_bytes: int
    output_bytes: int
    dominant_type: str
    block_matrix_bytes: tuple[tuple[str, int], ...]


def _tensor_sizes(headers: list[GGUFHeader]) -> _TensorSizes:
    """Bytes per transformer block and outside them, which the memory planner splits across devices,
    over every part of the model (`headers`: one per file)."""
    layers: dict[int, int] = {}
    by_type: dict[str, int] = {}
    matrices: dict[str, int] = {}
    n_params = non_layer = embd = output = 0
    for header, t in ((h, t) for h in headers for t in h.tensors):
        n_bytes = t.n_bytes
        n_params += t.n_elements
        type_name = ggml_type_name(t.ggml_type)
        by_type[type_name] = by_type.get(type_name, 0) + n_bytes
        match = _LAYER_TENSOR.match(t.name)
        if match:
            index = int(match.group(1))
            if index > MAX_BLOCKS:  # the block list below is as long as the highest index
                raise corrupt_at(header.path, header.size, header.data_offset + t.offset, f"block {index:,}")
            layers[index] = layers.get(index, 0) + n_bytes
            if len(t.shape) >= 2:
                matrices[type_name] = matrices.get(type_name, 0) + n_bytes
            continue
        non_layer += n_bytes
        if t.name == "token_embd.weight":
            embd = n_bytes
        elif t.name == "output.weight":
            output = n_bytes
    n_blocks = max(layers) + 1 if layers else 0
    dominant = max(by_type, key=lambda k: by_type[k]) if by_type else "unknown"
    return _TensorSizes(
        n_params=n_params,
        layer_bytes=tuple(layers.get(i, 0) for i in range(n_blocks)),
        non_layer_bytes=non_layer,
        token_embd_bytes=embd,
        output_bytes=output,
        dominant_type=dominant,
        block_matrix_bytes=tuple(sorted(matrices.items())),
    )


def _quant(meta: Mapping[str, Any], dominant_type: str) -> str:
    """The file type name (Q4_K_M); the type holding most bytes when the header does not say."""
    from gguf import LlamaFileType

    file_type = meta.get("general.file_type")
    if isinstance(file_type, int):
        try:
            name = LlamaFileType(file_type & ~LlamaFileType.GUESSED).name
        except ValueError:
            return dominant_type
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return dominant_type


def llama_cpp_knows(arch: str) -> bool:
    """Whether the bundled llama.cpp can load `arch` (encoders and projectors included).

    The `gguf` package is released from the llama.cpp tree, so its MODEL_ARCH_NAMES
    covers most names; the bundled llama.cpp can be newer, so a name missing there is
    looked up among the library's own strings, where llama.cpp keeps its arch table.
    """
    from gguf import MODEL_ARCH_NAMES

    if arch in MODEL_ARCH_NAMES.values():
        return True
    return b"\0" + arch.encode() + b"\0" in _libllama_bytes()


@functools.cache
def _libllama_bytes() -> bytes:
    spec = importlib.util.find_spec("llama_cpp")  # locates the package without loading the library
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        for lib in sorted((Path(folder) / "lib").glob("*llama.*")):
            try:
                return lib.read_bytes()
            except OSError:
                continue
    return b""


def _check_supported(info: GGUFInfo) -> None:
    if info.arch in _NOT_GENERATIVE:
        raise UnsupportedModelError(
            f"{info.path}: architecture {info.arch!r} cannot generate text (encoder, embedder or projector)"
        )
    if not llama_cpp_knows(info.arch):
        raise UnsupportedModelError(
            f"{info.path}: architecture {info.arch!r} is not one llama.cpp can run; "
            "a newer llama-cpp-python may support it"
        )
    if info.vocab_size == 0:
        raise UnsupportedModelError(f"{info.path}: has no tokenizer vocabulary, so it cannot generate text")
