"""A corpus of hostile GGUF files, written byte by byte by the tests.

Each file is a small valid model (`base`) with one thing made hostile: a length past
the end, arrays nested thousands deep, +inf where a count belongs, a huge block
index, terminal escapes in the name, ... `write_corpus` writes them all; `BASE` is the
one file among them that must read as a model, so a test that sees every other file
refused knows the refusal is about the hostile part.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# GGUF value types (ggml docs/gguf.md).
U32, I32, F32, BOOL, STRING, ARRAY, U64, F64 = 4, 5, 6, 7, 8, 9, 10, 12
GGML_F32 = 0
ALIGN = 32
TOKENS = ("<unk>", "<s>", "</s>", "a", "b", "c")
BASE = "base"
# Bytes a terminal would act on: clear screen, a title change, a hyperlink, a bell.
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\r\x08"


def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return string(key) + struct.pack("<I", vtype) + payload


def u32(key: str, value: int) -> bytes:
    return kv(key, U32, struct.pack("<I", value))


def text_kv(key: str, value: str | bytes) -> bytes:
    return kv(key, STRING, string(value))


def string_array(key: str, items: Sequence[str]) -> bytes:
    return kv(key, ARRAY, struct.pack("<IQ", STRING, len(items)) + b"".join(string(t) for t in items))


def tensor_info(name: str, dims: Sequence[int], ggml_type: int = GGML_F32, offset: int = 0) -> bytes:
    head = string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    return head + struct.pack("<IQ", ggml_type, offset)


@dataclass(frozen=True)
class Parts:
    """A GGUF as its parts, so each hostile file changes one of them."""

    kvs: tuple[bytes, ...]
    tensors: tuple[bytes, ...]
    data: bytes
    version: int = 3
    n_kv: int | None = None
    n_tensors: int | None = None

    def to_bytes(self) -> bytes:
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        n_tensors = len(self.tensors) if self.n_tensors is None else self.n_tensors
        out = b"GGUF" + struct.pack("<IQQ", self.version, n_tensors, n_kv)
        out += b"".join(self.kvs) + b"".join(self.tensors)
        out += b"\0" * (-len(out) % ALIGN)
        return out + self.data


def base(*, extra: Sequence[bytes] = (), name: str | bytes = "tiny") -> Parts:
    """A model localspec reads: llama, one block, six tokens, one F32 embedding matrix."""
    kvs = (
        text_kv("general.architecture", "llama"),
        text_kv("general.name", name),
        u32("llama.block_count", 1),
        u32("llama.context_length", 128),
        u32("llama.embedding_length", 8),
        u32("llama.attention.head_count", 2),
        text_kv("tokenizer.ggml.model", "gpt2"),
        string_array("tokenizer.ggml.tokens", TOKENS),
        *extra,
    )
    tensors = (tensor_info("token_embd.weight", (8, len(TOKENS))),)
    return Parts(kvs, tensors, b"\0" * (8 * len(TOKENS) * 4))


def _nested(depth: int) -> bytes:
    payload = struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQ", U32, 0)
    return kv("hostile.nested", ARRAY, payload)


def _with_count(key: str, vtype: int, raw: bytes) -> Parts:
    """The base file with one count replaced by a value of another type."""
    parts = base()
    kvs = tuple(kv(key, vtype, raw) if item.startswith(string(key)) else item for item in parts.kvs)
    return replace(parts, kvs=kvs)


def _with_tensor(info: bytes) -> Parts:
    parts = base()
    return replace(parts, tensors=(*parts.tensors, info))


HOSTILE: dict[str, Callable[[], Parts]] = {
    "nested-arrays": lambda: base(extra=[_nested(100_000)]),
    "ctx-inf": lambda: _with_count("llama.context_length", F32, struct.pack("<f", float("inf"))),
    "blocks-nan": lambda: _with_count("llama.block_count", F32, struct.pack("<f", float("nan"))),
    "heads-negative": lambda: _with_count("llama.attention.head_count", I32, struct.pack("<i", -2)),
    "embd-huge": lambda: _with_count("llama.embedding_length", U64, struct.pack("<Q", 1 << 63)),
    "ctx-string": lambda: _with_count("llama.context_length", STRING, string("lots")),
    "value-type-unknown": lambda: _with_count("llama.block_count", 99, struct.pack("<I", 1)),
    "string-too-long": lambda: base(extra=[kv("hostile.s", STRING, struct.pack("<Q", 1 << 62))]),
    "array-count-huge": lambda: base(extra=[kv("hostile.a", ARRAY, struct.pack("<IQ", U32, 1 << 61))]),
    "array-item-type-unknown": lambda: base(extra=[kv("hostile.a", ARRAY, struct.pack("<IQ", 77, 1))]),
    "tokens-count-huge": lambda: _with_count(
        "tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 1 << 40) + b"".join(map(string, TOKENS))
    ),
    "kv-count-huge": lambda: replace(base(), n_kv=1 << 62),
    "tensor-count-huge": lambda: replace(base(), n_tensors=1 << 62),
    "tensor-dims-huge": lambda: _with_tensor(string("x") + struct.pack("<I", 0xFFFFFFFF)),
    "tensor-type-unknown": lambda: _with_tensor(tensor_info("blk.0.x", (8,), ggml_type=9999, offset=256)),
    "tensor-past-the-end": lambda: _with_tensor(tensor_info("blk.0.x", (1 << 40,), offset=256)),
    "tensor-misaligned": lambda: _with_tensor(tensor_info("blk.0.x", (8,), offset=3)),
    "block-index-huge": lambda: _with_tensor(tensor_info("blk.99999999999.x", (0,), offset=0)),
    "alignment-zero": lambda: base(extra=[u32("general.alignment", 0)]),
    "alignment-odd": lambda: base(extra=[u32("general.alignment", 48)]),
    "arch-escapes": lambda: _with_count("general.architecture", STRING, string("llama" + ESCAPES)),
    "version-99": lambda: replace(base(), version=99),
    "truncated-header": lambda: Parts((), (), b"", n_kv=5),
}


def write_corpus(folder: Path) -> dict[str, Path]:
    """Every hostile file, plus BASE, as `<name>.gguf` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Callable[[], Parts]] = {BASE: base}
    made.update(HOSTILE)
    paths = {}
    for name, build in made.items():
        path = folder / f"{name}.gguf"
        path.write_bytes(build().to_bytes())
        paths[name] = path
    return paths


def write_escaped_name(path: Path) -> Path:
    """A valid model whose name holds terminal escapes: it must be listed, shown harmless."""
    path.write_bytes(base(name="evil" + ESCAPES).to_bytes())
    return path
