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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import ModelFileError

TOKENS_KEY = "tokenizer.ggml.tokens"
ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32
# Metadata arrays longer than this (merges, scores, token types) are skipped rather
# than decoded; per-layer arrays such as head counts stay well below it.
SMALL_ARRAY = 4096
_SUPPORTED_VERSIONS = (2, 3)

# Bounds a hostile header cannot pass: each is far above any real model's (the largest
# vocabularies hold ~260k tokens, the largest tables a few thousand tensors, templates
# tens of KB), and each keeps what one header can cost in memory and time small.
MAX_DEPTH = 3  # arrays of arrays of arrays; llama.cpp itself reads no nested array
MAX_TOKENS = 1 << 21
MAX_ENTRIES = 1 << 20  # metadata pairs, tensors
MAX_STRING = 16 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 1 << 16

# GGUF value types (gguf.md, "gguf_metadata_value_type").
_STRING, _ARRAY = 8, 9
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# The fewest bytes one item can take: a string is at least its u64 length, an array its type and count.
_MIN_BYTES = {_STRING: 8, _ARRAY: 12} | {t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8


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
    """Everything before the weights. `metadata` leaves out arrays longer than SMALL_ARRAY.

    `offsets` gives the byte offset of each metadata value, so a value that makes no sense
    to a later reader (an infinite layer count) is reported where it sits in the file.
    """

    version: int
    metadata: dict[str, Any]
    tokens: list[str]
    tensors: list[TensorEntry]
    data_offset: int
    path: Path
    size: int
    offsets: dict[str, int] = field(default_factory=dict)

    def bad_value(self, key: str, what: str) -> ModelFileError:
        """The corrupt-file error for metadata `key`, at its value's offset."""
        return corrupt_at(self.path, self.size, self.offsets.get(key, 0), f"{key} {what}")


class CorruptHeader(Exception):
    """Raised inside the reader: what is wrong, and the byte offset where it was found."""

    def __init__(self, offset: int, what: str) -> None:
        super().__init__(what)
        self.offset = offset
        self.what = what


def read_header(path: Path) -> GGUFHeader:
    """Parse the header of the GGUF at `path`; ModelFileError, with the offset, when it is corrupt."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise corrupt_at(path, size, size, "shorter than a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buf, path)
    try:
        header = cursor.header()
    except CorruptHeader as exc:
        raise corrupt_at(path, size, exc.offset, exc.what) from None
    except (struct.error, ValueError, IndexError, KeyError, OverflowError, RecursionError, MemoryError):
        # A safety net: every check above should come first, but a person needs the verdict, not the trace.
        raise corrupt_at(path, size, cursor.pos, "unreadable value") from None
    finally:
        buf.close()
    for t in header.tensors:
        if header.data_offset + t.offset + t.n_bytes > size:
            raise corrupt_at(
                path, size, header.data_offset + t.offset, f"tensor {t.name!r} runs past the end"
            )
    return header


def corrupt_at(path: Path, size: int, offset: int, what: str) -> ModelFileError:
    """The one error every malformed header becomes: where, what, and what to do."""
    return ModelFileError(
        f"{path}: truncated or corrupt GGUF ({size:,} bytes; at byte {offset:,}: {what}); download it again"
    )


class _Cursor:
    """Reads values in order from a buffer, checking each length against what is left of it.

    `fmt` prefixes carry the file's byte order.
    """

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 4  # after the magic, which the caller checked
        self.order = "<"
        self.offsets: dict[str, int] = {}

    def fail(self, what: str, at: int | None = None) -> CorruptHeader:
        return CorruptHeader(self.pos if at is None else at, what)

    def header(self) -> GGUFHeader:
        (version,) = struct.unpack_from("<I", self.buf, 4)
        if version & 0xFFFF == 0:  # a big-endian file reads as a huge little-endian number
            self.order = ">"
            (version,) = struct.unpack_from(">I", self.buf, 4)
        if version not in _SUPPORTED_VERSIONS:
            raise self.fail(f"GGUF version {version}", at=4)
        self.pos = 8
        n_tensors, n_kv = self.unpack("QQ")
        self.check_count(n_kv, _MIN_KV_BYTES, MAX_ENTRIES, "metadata entries")
        metadata, tokens = self.metadata(n_kv)
        self.check_count(n_tensors, _MIN_TENSOR_BYTES, MAX_ENTRIES, "tensors")
        alignment = self.alignment(metadata)
        tensors = [self.tensor(alignment) for _ in range(n_tensors)]
        data_offset = -(-self.pos // alignment) * alignment
        return GGUFHeader(
            version, metadata, tokens, tensors, data_offset, self.path, len(self.buf), self.offsets
        )

    def metadata(self, n_kv: int) -> tuple[dict[str, Any], list[str]]:
        metadata: dict[str, Any] = {}
        tokens: list[str] = []
        for _ in range(n_kv):
            key = self.string(limit=1 << 16)
            (vtype,) = self.unpack("I")
            self.offsets[key] = self.pos
            if key == TOKENS_KEY and vtype == _ARRAY:
                tokens = self.string_array()
                continue
            value = self.value(vtype, depth=0)
            if value is not _SKIPPED:
                metadata[key] = value
        return metadata, tokens

    def alignment(self, metadata: dict[str, Any]) -> int:
        alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
        valid = isinstance(alignment, int) and not isinstance(alignment, bool)
        if not valid or not 0 < alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
            raise self.fail(
                f"{ALIGNMENT_KEY} is {alignment!r}, not a power of two", self.offsets[ALIGNMENT_KEY]
            )
        return int(alignment)

    def check_count(self, n: int, min_bytes: int, most: int, what: str) -> None:
        """Refuse a count the rest of the file cannot hold, before looping over it."""
        if n > most or n * min_bytes > len(self.buf) - self.pos:
            raise self.fail(f"{n:,} {what} cannot fit in the file")

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        fmt = self.order + fmt
        width = struct.calcsize(fmt)
        if self.pos + width > len(self.buf):
            raise self.fail("the header runs past the end of the file")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return values

    def raw_string(self, limit: int) -> bytes:
        (n,) = self.unpack("Q")
        start = self.pos
        if n > limit or start + n > len(self.buf):
            raise self.fail(f"a string of {n:,} bytes", at=start - 8)
        self.pos = start + n
        return self.buf[start : self.pos]

    def string(self, limit: int = MAX_STRING) -> str:
        # surrogateescape keeps byte-level tokens that are not valid UTF-8 distinct and round-trippable.
        return self.raw_string(limit).decode("utf-8", "surrogateescape")

    def value(self, vtype: int, depth: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(depth + 1)
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise self.fail(f"unknown value type {vtype}", at=self.pos - 4)
        (value,) = self.unpack(fmt)
        return value

    def array(self, depth: int) -> Any:
        start = self.pos
        item_type, n = self.unpack("IQ")
        if depth > MAX_DEPTH:
            raise self.fail(f"arrays nested {depth} deep", at=start)
        if item_type not in _MIN_BYTES:
            raise self.fail(f"unknown array item type {item_type}", at=start)
        self.check_count(n, _MIN_BYTES[item_type], 1 << 62, "array items")
        if item_type == _STRING and n > SMALL_ARRAY:
            self.skip_strings(n)
            return _SKIPPED
        if item_type in (_STRING, _ARRAY):
            items = [self.value(item_type, depth) for _ in range(n)]
            return items if n <= SMALL_ARRAY else _SKIPPED
        fmt = _SCALAR_FORMATS[item_type]
        if n > SMALL_ARRAY:
            self.pos += n * struct.calcsize(fmt)
            return _SKIPPED
        return list(self.unpack(f"{n}{fmt}"))

    def string_array(self) -> list[str]:
        item_type, n = self.unpack("IQ")
        if item_type != _STRING:
            raise self.fail("the token list is not an array of strings", at=self.pos - 12)
        self.check_count(n, 8, MAX_TOKENS, "tokens")
        # The hot loop of the whole reader (150k+ tokens): locals instead of attribute lookups.
        buf, pos, end, length = self.buf, self.pos, len(self.buf), struct.Struct(self.order + "Q")
        out: list[str] = []
        append = out.append
        for _ in range(n):
            if pos + 8 > end:
                break
            (size,) = length.unpack_from(buf, pos)
            pos += 8
            append(buf[pos : pos + size].decode("utf-8", "surrogateescape"))
            pos += size
        if len(out) < n or pos > end:
            raise self.fail(f"the token list runs past the end of the file (token {len(out):,})")
        self.pos = pos
        return out

    def skip_strings(self, n: int) -> None:
        buf, pos, end, length = self.buf, self.pos, len(self.buf), struct.Struct(self.order + "Q")
        for _ in range(n):
            if pos + 8 > end:
                break
            pos += 8 + length.unpack_from(buf, pos)[0]
        else:
            if pos <= end:
                self.pos = pos
                return
        raise self.fail("a string array runs past the end of the file")

    def tensor(self, alignment: int) -> TensorEntry:
        start = self.pos
        name = self.string(limit=1 << 16)
        (n_dims,) = self.unpack("I")
        if n_dims > MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dimensions", at=start)
        shape = self.unpack(f"{n_dims}Q")
        ggml_type, offset = self.unpack("IQ")
        sizes = _quant_sizes().get(ggml_type)
        if sizes is None:
            raise self.fail(f"tensor {name!r} has unknown type {ggml_type}", at=start)
        if offset % alignment:
            raise self.fail(f"tensor {name!r} is not aligned to {alignment} bytes", at=start)
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        if shape and shape[0] % sizes[0]:
            raise self.fail(
                f"tensor {name!r}: a row of {shape[0]} is not whole blocks of {sizes[0]}", at=start
            )
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
