"""A lean reader for a GGUF file's header: metadata, token texts and the tensor table.

`gguf.GGUFReader` builds a numpy view for every metadata part and every token,
which costs 8-15 s for a 150k-token vocabulary on a slow CPU. This reader walks
the same bytes with `struct` over a memory map, keeps only what `gguf_info`
needs, and takes about a tenth of a second for the same file. The weights are
never read: only their offsets and sizes, to tell a truncated file.

Layout (GGUF v2/v3, github.com/ggml-org/ggml/blob/master/docs/gguf.md):
magic, version u32, tensor count u64, metadata count u64; metadata as
(string key, u32 type, value); tensor infos as (string name, u32 n_dims,
u64 dims..., u32 ggml type, u64 offset); then the data, aligned to
`general.alignment` (32 by default).
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import ModelFileError

TOKENS_KEY = "tokenizer.ggml.tokens"
DEFAULT_ALIGNMENT = 32
# Metadata arrays longer than this (merges, scores, token types) are skipped rather
# than decoded; per-layer arrays such as head counts stay well below it.
SMALL_ARRAY = 4096
_SUPPORTED_VERSIONS = (2, 3)

# GGUF value types (gguf.md, "gguf_metadata_value_type").
_STRING, _ARRAY = 8, 9
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table: where a tensor's bytes are and how big it is."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before the weights. `metadata` leaves out arrays longer than SMALL_ARRAY."""

    version: int
    metadata: dict[str, Any]
    tokens: list[str]
    tensors: list[TensorEntry]
    data_offset: int


def read_header(path: Path) -> GGUFHeader:
    """Parse the header of the GGUF at `path`; ModelFileError when it is truncated or corrupt."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise _corrupt(path, size)
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        header = _Cursor(buf).header()
    except (struct.error, ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError):
        # A short read shows up as any of these; a person needs the verdict, not the trace.
        raise _corrupt(path, size) from None
    finally:
        buf.close()
    if any(header.data_offset + t.offset + t.n_bytes > size for t in header.tensors):
        raise _corrupt(path, size)
    return header


def _corrupt(path: Path, size: int) -> ModelFileError:
    return ModelFileError(f"{path}: truncated or corrupt GGUF ({size:,} bytes); download it again")


class _Cursor:
    """Reads values in order from a buffer; `fmt` prefixes carry the file's byte order."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 4  # after the magic, which the caller checked
        self.order = "<"

    def header(self) -> GGUFHeader:
        (version,) = struct.unpack_from("<I", self.buf, 4)
        if version & 0xFFFF == 0:  # a big-endian file reads as a huge little-endian number
            self.order = ">"
            (version,) = struct.unpack_from(">I", self.buf, 4)
        if version not in _SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version}")
        self.pos = 8
        n_tensors, n_kv = self.unpack("QQ")
        metadata: dict[str, Any] = {}
        tokens: list[str] = []
        for _ in range(n_kv):
            key = self.string()
            (vtype,) = self.unpack("I")
            if key == TOKENS_KEY and vtype == _ARRAY:
                tokens = self.string_array()
                continue
            value = self.value(vtype)
            if value is not _SKIPPED:
                metadata[key] = value
        tensors = [self.tensor() for _ in range(n_tensors)]
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            alignment = DEFAULT_ALIGNMENT
        data_offset = -(-self.pos // alignment) * alignment
        return GGUFHeader(version, metadata, tokens, tensors, data_offset)

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        fmt = self.order + fmt
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def raw_string(self) -> bytes:
        (n,) = struct.unpack_from(self.order + "Q", self.buf, self.pos)
        start = self.pos + 8
        end = start + n
        if end > len(self.buf):
            raise ValueError("string runs past the end of the file")
        self.pos = end
        return self.buf[start:end]

    def string(self) -> str:
        # surrogateescape keeps byte-level tokens that are not valid UTF-8 distinct and round-trippable.
        return self.raw_string().decode("utf-8", "surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        (value,) = self.unpack(_SCALAR_FORMATS[vtype])
        return value

    def array(self) -> Any:
        item_type, n = self.unpack("IQ")
        if item_type == _STRING:
            if n > SMALL_ARRAY:
                self.skip_strings(n)
                return _SKIPPED
            return [self.string() for _ in range(n)]
        if item_type == _ARRAY:
            return [self.array() for _ in range(n)]
        fmt = _SCALAR_FORMATS[item_type]
        width = struct.calcsize(fmt)
        if self.pos + n * width > len(self.buf):
            raise ValueError("array runs past the end of the file")
        if n > SMALL_ARRAY:
            self.pos += n * width
            return _SKIPPED
        return list(self.unpack(f"{n}{fmt}"))

    def string_array(self) -> list[str]:
        item_type, n = self.unpack("IQ")
        if item_type != _STRING:
            raise ValueError("token list is not an array of strings")
        # The hot loop of the whole reader (150k+ tokens): locals instead of attribute lookups.
        buf, pos, length = self.buf, self.pos, struct.Struct(self.order + "Q")
        out: list[str] = []
        append = out.append
        for _ in range(n):
            (size,) = length.unpack_from(buf, pos)
            pos += 8
            append(buf[pos : pos + size].decode("utf-8", "surrogateescape"))
            pos += size
        if pos > len(buf):
            raise ValueError("token list runs past the end of the file")
        self.pos = pos
        return out

    def skip_strings(self, n: int) -> None:
        buf, pos, length = self.buf, self.pos, struct.Struct(self.order + "Q")
        for _ in range(n):
            pos += 8 + length.unpack_from(buf, pos)[0]
        if pos > len(buf):
            raise ValueError("array runs past the end of the file")
        self.pos = pos

    def tensor(self) -> TensorEntry:
        name = self.string()
        (n_dims,) = self.unpack("I")
        shape = self.unpack(f"{n_dims}Q")
        ggml_type, offset = self.unpack("IQ")
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        return TensorEntry(name, shape, ggml_type, offset, n_elements, tensor_bytes(ggml_type, n_elements))


class _Skipped:
    """Marks a metadata value left out on purpose (a big array)."""


_SKIPPED: Any = _Skipped()


def tensor_bytes(ggml_type: int, n_elements: int) -> int:
    """Bytes a tensor of `n_elements` takes in `ggml_type` (blocks of quantized values)."""
    block, type_size = _quant_sizes()[ggml_type]
    return n_elements // block * type_size


@functools.cache
def ggml_type_name(ggml_type: int) -> str:
    """Q4_K, F16, ...; the number itself for a type this gguf package does not know."""
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


@functools.cache
def _quant_sizes() -> dict[int, tuple[int, int]]:
    # The gguf package is released from the llama.cpp tree, so its table follows ggml's types.
    from gguf import GGML_QUANT_SIZES

    return {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}
