"""scripts/shaped_gguf.py: a model's layout and tokenizer with other weights, for machines that
cannot receive the real file (the GPU machine)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from scriptmodules import load_script
from tinymodels import write_tiny_model

from localspec.engine.llama import LlamaModel

shaped = load_script("shaped_gguf")


def _fields(reader: gguf.GGUFReader) -> dict[str, object]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def test_a_shaped_copy_keeps_layout_and_tokenizer_and_draws_its_weights(tmp_path: Path) -> None:
    source = write_tiny_model(tmp_path / "source.gguf", dtype="q8_0")
    layout = tmp_path / "layout.npz"
    # Vectors of n_embd (64) kept exactly, every matrix drawn from the pools (f32 ones too).
    shaped.dump(source, layout, pool_blocks=256, exact_elements=64)
    made = tmp_path / "shaped.gguf"
    assert shaped.make(layout, made, seed=1) == source.stat().st_size

    a, b = gguf.GGUFReader(source), gguf.GGUFReader(made)
    assert _fields(a) == _fields(b)
    assert [(t.name, list(t.shape), t.tensor_type) for t in a.tensors] == [
        (t.name, list(t.shape), t.tensor_type) for t in b.tensors
    ]
    q8 = gguf.GGMLQuantizationType.Q8_0
    size = gguf.GGML_QUANT_SIZES[q8][1]
    real = {bytes(r) for t in a.tensors if t.tensor_type == q8 for r in np.asarray(t.data).reshape(-1, size)}
    drawn = 0
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        if ta.n_elements <= 64:
            assert np.array_equal(ta.data, tb.data), ta.name
            continue
        assert not np.array_equal(ta.data, tb.data), ta.name
        if ta.tensor_type == q8:
            # Every block is one of the source's real blocks (real scales: no NaN, no inf).
            assert all(bytes(r) in real for r in np.asarray(tb.data).reshape(-1, size))
            drawn += 1
    assert drawn > 0

    real_model, copy = LlamaModel(source), LlamaModel(made)
    text = "def hello(world): return world"
    assert copy.tokenize(text) == real_model.tokenize(text)
    copy.decode(copy.tokenize(text))
    assert np.isfinite(copy.logits(-1)).all()


def test_make_draws_the_same_weights_for_the_same_seed(tmp_path: Path) -> None:
    source = write_tiny_model(tmp_path / "source.gguf", dtype="q8_0")
    layout = tmp_path / "layout.npz"
    shaped.dump(source, layout)
    one, two, other = (tmp_path / f"{n}.gguf" for n in ("one", "two", "other"))
    shaped.make(layout, one, seed=3)
    shaped.make(layout, two, seed=3)
    shaped.make(layout, other, seed=4)
    assert one.read_bytes() == two.read_bytes()
    assert one.read_bytes() != other.read_bytes()


@pytest.mark.slow
def test_the_real_draft_model_shaped_tokenizes_and_sizes_as_the_real_one(
    qwen_draft: Path, tmp_path: Path
) -> None:
    layout = tmp_path / "draft.npz"
    shaped.dump(qwen_draft, layout)
    assert layout.stat().st_size < 16e6  # it travels to the GPU machine with the rest: ~5 MB
    made = tmp_path / "draft.gguf"
    assert shaped.make(layout, made) == qwen_draft.stat().st_size
    real_model, copy = LlamaModel(qwen_draft), LlamaModel(made)
    text = "<|im_start|>user\nRename `total` to `count`.<|im_end|>\n"
    assert copy.tokenize(text) == real_model.tokenize(text)
    assert copy.size_bytes == real_model.size_bytes


def test_a_layout_made_at_a_larger_size_loads_with_that_size_and_the_same_tokenizer(tmp_path: Path) -> None:
    source = write_tiny_model(tmp_path / "source.gguf", dtype="q8_0", n_layers=3)
    layout = tmp_path / "layout.npz"
    shaped.dump(source, layout, exact_elements=64)
    # The tiny model's heads are 16 wide (64 / 4): twice the width, 2.5x the feed-forward, 5 layers.
    bigger = shaped.Shape(hidden=128, ffn=320, heads=8, kv_heads=4, layers=5, label="big")
    made = tmp_path / "big.gguf"
    shaped.make(layout, made, like=bigger)

    reader = gguf.GGUFReader(made)
    fields = _fields(reader)
    assert (fields["llama.embedding_length"], fields["llama.feed_forward_length"]) == (128, 320)
    assert (fields["llama.attention.head_count"], fields["llama.attention.head_count_kv"]) == (8, 4)
    assert (fields["llama.block_count"], fields["general.size_label"]) == (5, "big")
    shapes = {t.name: list(t.shape) for t in reader.tensors}
    assert shapes["blk.4.attn_q.weight"] == [128, 128]
    assert shapes["blk.4.attn_k.weight"] == [128, 64]  # 4 kv heads of 16
    assert shapes["blk.4.ffn_down.weight"] == [320, 128]
    assert shapes["blk.0.attn_norm.weight"] == [128]
    source_reader = gguf.GGUFReader(source)
    vocab = next(list(t.shape)[1] for t in source_reader.tensors if t.name == "token_embd.weight")
    assert shapes["token_embd.weight"] == [128, vocab]
    per_layer = (len(source_reader.tensors) - 3) // 3  # 3 outside the layers
    assert len(reader.tensors) == 5 * per_layer + 3

    real_model, copy = LlamaModel(source), LlamaModel(made)
    text = "def hello(world): return world"
    assert copy.tokenize(text) == real_model.tokenize(text)
    copy.decode(copy.tokenize(text))
    assert copy.logits(-1).shape == (vocab,)
    assert np.isfinite(copy.logits(-1)).all()


def test_a_size_whose_heads_differ_from_the_source_is_refused(tmp_path: Path) -> None:
    source = write_tiny_model(tmp_path / "source.gguf", dtype="q8_0")
    layout = tmp_path / "layout.npz"
    shaped.dump(source, layout)
    with pytest.raises(ValueError, match="16-wide head"):
        shaped.make(layout, tmp_path / "x.gguf", like=shaped.Shape(128, 256, 4, 2, 3, "x"))
