"""A model's shape without its weights: a GGUF with the same tensors, types and metadata, random weights.

A GPU machine that takes a few megabytes per call cannot receive a 1 GB model, but what a
decode costs there depends on the tensors' shapes and quantization types, not on their
values. `dump` keeps everything but the weights of a real GGUF (every metadata key, the
tokenizer and chat template included, and each tensor's name, shape and type) plus a pool of
real blocks per quantization type; `make` writes a model with that layout whose every
quantized block is drawn (seeded) from the pool, so its scales are real ones and it decodes
without NaNs. Small float tensors (norms, biases) are kept exactly.

Such a model tokenizes as the real one does and costs what it costs to run; its text is
nonsense, so acceptance rates must come from the real model (recorded traces).

`make --like 7b` (or 14b, 32b) writes the same family at a larger size: Qwen2.5's hidden size,
feed-forward size, head counts and layer count for that size, each layer with the quantization
types of the source's layer at the same depth, the source's tokenizer. A 7B-32B target cannot
travel either, and it is what users run with a 0.5B draft; its file is what llama.cpp would load
for that model, up to the vocabulary (Qwen2.5-7B pads its embedding to 152,064 rows, the source's
151,936 are kept so the draft's vocabulary matches).

    .venv/bin/python scripts/shaped_gguf.py dump models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf q15.npz
    python3 scripts/shaped_gguf.py make q15.npz /tmp/q15-shaped.gguf
    python3 scripts/shaped_gguf.py make q15.npz /tmp/q7b-shaped.gguf --like 7b
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

FLOAT_TYPES = {
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F16: np.float16,
}
# Float tensors up to this many elements are kept as they are (norms, biases: a few MB in all).
EXACT_ELEMENTS = 1 << 20
POOL_BLOCKS = 8192
# Reader fields that describe the file, not the model; the writer adds its own.
SKIP_KEYS = ("GGUF.", "general.architecture", "general.alignment")


@dataclass(frozen=True)
class Shape:
    """A transformer's size: what `make --like` changes in a layout (head size and vocabulary kept)."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    layers: int
    label: str


# Qwen2.5's sizes (the models' config.json: hidden_size, intermediate_size, num_attention_heads,
# num_key_value_heads, num_hidden_layers), all with 128-wide heads as the 0.5B-3B have.
QWEN25 = {
    "7b": Shape(3584, 18944, 28, 4, 28, "7B"),
    "14b": Shape(5120, 13824, 40, 8, 48, "14B"),
    "32b": Shape(5120, 27648, 40, 8, 64, "32B"),
}


def _value(field: Any) -> tuple[str, str | None, Any]:
    types = [gguf.GGUFValueType(t) for t in field.types]
    main = types[0]
    sub = types[-1] if main == gguf.GGUFValueType.ARRAY else None
    value = field.contents()
    return main.name, (sub.name if sub is not None else None), value


def dump(
    source: Path,
    out: Path,
    pool_blocks: int = POOL_BLOCKS,
    seed: int = 0,
    exact_elements: int = EXACT_ELEMENTS,
) -> dict[str, Any]:
    """Write the layout of `source` (metadata, tensors, block pools, small float tensors) to `out`."""
    reader = gguf.GGUFReader(source)
    rng = np.random.default_rng(seed)
    metadata = [
        [key, *_value(field)] for key, field in reader.fields.items() if not key.startswith(SKIP_KEYS)
    ]
    arch = str(reader.fields["general.architecture"].contents())
    tensors: list[dict[str, Any]] = []
    arrays: dict[str, Any] = {}
    by_type: dict[int, list[npt.NDArray[np.uint8]]] = {}
    for t in reader.tensors:
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        entry: dict[str, Any] = {"name": t.name, "type": qtype.name, "shape": [int(n) for n in t.shape]}
        tensors.append(entry)
        if qtype in FLOAT_TYPES and t.n_elements <= exact_elements:
            entry["exact"] = True
            arrays[f"exact/{t.name}"] = np.asarray(t.data)
            continue
        block_bytes = gguf.GGML_QUANT_SIZES[qtype][1] if qtype not in FLOAT_TYPES else t.data.itemsize
        blocks = np.asarray(t.data).view(np.uint8).reshape(-1, block_bytes)
        by_type.setdefault(int(qtype), []).append(blocks)
    for type_id, parts in by_type.items():
        per_tensor = max(1, pool_blocks // len(parts))
        picked = [p[rng.choice(len(p), size=min(per_tensor, len(p)), replace=False)] for p in parts]
        arrays[f"pool/{gguf.GGMLQuantizationType(type_id).name}"] = np.concatenate(picked)
    layout = {"source": source.name, "architecture": arch, "metadata": metadata, "tensors": tensors}
    arrays["layout"] = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
    np.savez_compressed(out, **arrays)
    return layout


def _metadata_value(vtype: str, sub: str | None, value: Any) -> tuple[Any, Any, Any]:
    main = gguf.GGUFValueType[vtype]
    subtype = gguf.GGUFValueType[sub] if sub is not None else None
    return value, main, subtype


def _meta(layout: dict[str, Any], key: str) -> Any:
    return next(value for k, _, _, value in layout["metadata"] if k == key)


def resized(layout: dict[str, Any], arrays: dict[str, Any], shape: Shape, rng: Any) -> dict[str, Any]:
    """`layout` at `shape`'s size: tensors scaled by role, layers mapped by depth, metadata to match.

    Small float tensors (norms, biases) of a new size are drawn from the source tensor's own values
    and added to `arrays`.
    """
    arch = layout["architecture"]
    hidden, ffn = int(_meta(layout, f"{arch}.embedding_length")), _meta(layout, f"{arch}.feed_forward_length")
    heads = _meta(layout, f"{arch}.attention.head_count")
    kv_heads = _meta(layout, f"{arch}.attention.head_count_kv")
    layers = int(_meta(layout, f"{arch}.block_count"))
    if not all(isinstance(v, int) for v in (ffn, heads, kv_heads)):
        raise ValueError("per-layer head counts or feed-forward sizes cannot be resized")
    head = hidden // heads
    if shape.hidden != shape.heads * head:
        width = shape.hidden / shape.heads
        raise ValueError(f"{shape.label}: {width:g}-wide heads, not the source's {head}-wide head")
    kv, new_kv = kv_heads * head, shape.kv_heads * head

    def dims(name: str, old: list[int]) -> list[int]:
        role = name.rsplit(".", 2)[-2] if name.startswith("blk.") else name.split(".")[0]
        if role in ("attn_k", "attn_v"):
            table = {hidden: shape.hidden, kv: new_kv}
        elif role in ("ffn_gate", "ffn_up", "ffn_down"):
            table = {hidden: shape.hidden, ffn: shape.ffn}
        else:
            table = {hidden: shape.hidden}
        return [table.get(n, n) for n in old]

    source = {t["name"]: t for t in layout["tensors"]}
    tensors: list[dict[str, Any]] = []
    for t in layout["tensors"]:
        if not t["name"].startswith("blk."):
            tensors.append(_scaled(t, t["name"], dims(t["name"], t["shape"]), arrays, rng))
    for i in range(shape.layers):
        depth = i * layers // shape.layers
        prefix = f"blk.{depth}."
        for name, t in source.items():
            if name.startswith(prefix):
                new_name = f"blk.{i}.{name[len(prefix) :]}"
                tensors.append(_scaled(t, new_name, dims(name, t["shape"]), arrays, rng))
    changed = {
        f"{arch}.embedding_length": shape.hidden,
        f"{arch}.feed_forward_length": shape.ffn,
        f"{arch}.attention.head_count": shape.heads,
        f"{arch}.attention.head_count_kv": shape.kv_heads,
        f"{arch}.block_count": shape.layers,
        "general.size_label": shape.label,
    }
    metadata = [[k, vtype, sub, changed.get(k, value)] for k, vtype, sub, value in layout["metadata"]]
    if "general.size_label" not in {m[0] for m in metadata}:
        metadata.append(["general.size_label", "STRING", None, shape.label])
    return {**layout, "metadata": metadata, "tensors": tensors}


def _scaled(
    t: dict[str, Any], name: str, shape: list[int], arrays: dict[str, Any], rng: Any
) -> dict[str, Any]:
    qtype = gguf.GGMLQuantizationType[t["type"]]
    if qtype not in FLOAT_TYPES and shape[0] % gguf.GGML_QUANT_SIZES[qtype][0]:
        raise ValueError(f"{name}: rows of {shape[0]} do not split into {qtype.name} blocks")
    entry = {**t, "name": name, "shape": shape}
    if t.get("exact"):
        values = arrays[f"exact/{t['name']}"]
        n = int(np.prod(shape))
        arrays[f"exact/{name}"] = values if values.size == n else rng.choice(values.reshape(-1), size=n)
    return entry


def make(layout_file: Path, out: Path, seed: int = 0, like: Shape | None = None) -> int:
    """Write a GGUF with the layout's metadata and tensors, weights drawn from its pools. Returns bytes.

    `like`: the same family at that size (resized()).
    """
    with np.load(layout_file) as data:
        layout = json.loads(data["layout"].tobytes())
        arrays = {name: data[name] for name in data.files if name != "layout"}
    rng = np.random.default_rng(seed)
    if like is not None:
        layout = resized(layout, arrays, like, rng)
    writer = gguf.GGUFWriter(out, layout["architecture"])
    for key, vtype, sub, value in layout["metadata"]:
        val, main, subtype = _metadata_value(vtype, sub, value)
        writer.add_key_value(key, val, main, subtype)
    for t in layout["tensors"]:
        qtype = gguf.GGMLQuantizationType[t["type"]]
        if t.get("exact"):
            writer.add_tensor(t["name"], arrays[f"exact/{t['name']}"], raw_dtype=qtype)
            continue
        drawn = _drawn(arrays[f"pool/{qtype.name}"], qtype, t["shape"], rng)
        writer.add_tensor(t["name"], drawn, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out.stat().st_size


def _drawn(pool: npt.NDArray[Any], qtype: gguf.GGMLQuantizationType, shape: list[int], rng: Any) -> Any:
    """A tensor of `shape` (ggml order: ne0 first) whose blocks are drawn from the pool."""
    ne0, rows = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    if qtype in FLOAT_TYPES:
        values = pool.view(FLOAT_TYPES[qtype]).reshape(-1)
        return values[rng.integers(0, len(values), size=ne0 * rows)].reshape(*reversed(shape))
    block_elements, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    per_row = ne0 // block_elements
    picked = pool[rng.integers(0, len(pool), size=rows * per_row)]
    return picked.reshape(*reversed(shape[1:]), per_row * block_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    d = verbs.add_parser("dump", help="Keep a real GGUF's layout and a pool of its blocks (.npz).")
    d.add_argument("source", type=Path)
    d.add_argument("out", type=Path)
    d.add_argument("--pool-blocks", type=int, default=POOL_BLOCKS)
    m = verbs.add_parser("make", help="Write a GGUF with that layout and drawn weights.")
    m.add_argument("layout", type=Path)
    m.add_argument("out", type=Path)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--like", choices=sorted(QWEN25), help="Write it at this Qwen2.5 size instead.")
    args = parser.parse_args(argv)
    if args.verb == "dump":
        layout = dump(args.source, args.out, args.pool_blocks)
        size = args.out.stat().st_size
        print(f"{args.out}: {len(layout['tensors'])} tensors, {size / 1e6:.1f} MB", file=sys.stderr)
    else:
        size = make(args.layout, args.out, args.seed, QWEN25[args.like] if args.like else None)
        print(f"{args.out}: {size / 1e6:.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
