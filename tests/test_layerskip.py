"""Layer-skip drafts: derived from real GGUFs, loaded by llama.cpp, cached by content."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import pytest
import tinymodels

from localspec.errors import ModelFileError, UserInputError
from localspec.models.layerskip import default_keep, derive_layerskip_draft

PROMPTS = ("the model is", "def main(self):", "hello world", "we write a test", "import numpy as np")


def _load(path: Path) -> Any:
    # One thread: a tiny model gains nothing from more, and spinning threads crawl on a busy machine.
    return llama_cpp.Llama(model_path=str(path), n_ctx=512, logits_all=True, n_threads=1, verbose=False)


def _field(path: Path, key: str) -> Any:
    field = gguf.GGUFReader(path).get_field(key)
    assert field is not None, key
    return field.contents()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "derived"


@pytest.fixture(scope="module")
def target_llm(tiny_target: Path) -> Iterator[Any]:
    llm = _load(tiny_target)
    yield llm
    llm.close()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 18, 24, 28, 30, 80])
def test_default_keep_is_half_the_depth_with_the_first_and_last_layers(n: int) -> None:
    keep = default_keep(n)
    assert keep == sorted(set(keep))
    assert len(keep) == (n + 1) // 2 if n > 2 else n
    assert keep[0] == 0
    assert keep[-1] == n - 1


def test_default_keep_for_qwen_15b() -> None:
    assert default_keep(28) == [0, 1, 2, 3, *range(18, 28)]


def test_derived_draft_has_the_kept_blocks(tiny_target: Path, cache_dir: Path) -> None:
    path = derive_layerskip_draft(tiny_target, cache_dir=cache_dir)
    assert path.parent == cache_dir
    assert _field(path, "llama.block_count") == 2
    assert _field(path, "localspec.layerskip.kept_layers") == [0, 2]
    source = {t.name: t for t in gguf.GGUFReader(tiny_target).tensors}
    derived = {t.name: t for t in gguf.GGUFReader(path).tensors}
    expected = {n for n in source if n.startswith("blk.0.")} | {
        n.replace("blk.2.", "blk.1.") for n in source if n.startswith("blk.2.")
    }
    assert {n for n in derived if n.startswith("blk.")} == expected
    assert {n for n in derived if not n.startswith("blk.")} == {n for n in source if not n.startswith("blk.")}
    # blk.1 of the draft is blk.2 of the target, byte for byte.
    assert bytes(derived["blk.1.attn_q.weight"].data) == bytes(source["blk.2.attn_q.weight"].data)
    assert bytes(derived["output.weight"].data) == bytes(source["output.weight"].data)
    llm = _load(path)
    try:
        assert llm.metadata["llama.block_count"] == "2"
        assert llm.create_completion("hello", max_tokens=8, temperature=0)["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


def test_derived_draft_has_the_targets_vocabulary(
    tiny_target: Path, target_llm: Any, cache_dir: Path
) -> None:
    path = derive_layerskip_draft(tiny_target, cache_dir=cache_dir)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.chat_template"):
        assert _field(path, key) == _field(tiny_target, key)
    draft = _load(path)
    try:
        text = b"<|im_start|>user\nprint the code<|im_end|>"
        assert draft.tokenize(text, special=True) == target_llm.tokenize(text, special=True)
        assert draft.token_eos() == target_llm.token_eos()
    finally:
        draft.close()


def test_second_call_is_a_cache_hit(tiny_target: Path, cache_dir: Path) -> None:
    first = derive_layerskip_draft(tiny_target, [2, 0], cache_dir=cache_dir)
    before = first.stat()
    second = derive_layerskip_draft(tiny_target, [0, 2], cache_dir=cache_dir)
    assert second == first
    assert (second.stat().st_mtime_ns, second.stat().st_ino) == (before.st_mtime_ns, before.st_ino)
    assert not list(cache_dir.glob(".*.tmp"))
    assert derive_layerskip_draft(tiny_target, [0, 1], cache_dir=cache_dir) != first


def test_a_changed_target_gets_a_new_draft(tmp_path: Path, cache_dir: Path) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf", seed=1)
    first = derive_layerskip_draft(target, cache_dir=cache_dir)
    old_mtime = target.stat().st_mtime_ns
    tinymodels.write_tiny_model(target, seed=2)  # same size: only the content differs
    os.utime(target, ns=(old_mtime + 10**9,) * 2)  # a coarse clock may not have ticked
    second = derive_layerskip_draft(target, cache_dir=cache_dir)
    assert second != first
    assert bytes(gguf.GGUFReader(second).tensors[0].data) == bytes(gguf.GGUFReader(target).tensors[0].data)


def test_keeping_every_layer_reproduces_the_target(
    tiny_target: Path, target_llm: Any, cache_dir: Path
) -> None:
    draft = _load(derive_layerskip_draft(tiny_target, [0, 1, 2], cache_dir=cache_dir))
    try:
        for prompt in PROMPTS:
            tokens = target_llm.tokenize(prompt.encode())
            expected = tinymodels.greedy_continuation(target_llm, tokens, 32)
            assert tinymodels.greedy_continuation(draft, tokens, 32) == expected
    finally:
        draft.close()


def test_quantized_tensors_are_copied_raw(tmp_path: Path, cache_dir: Path) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "q.gguf", n_layers=4, dtype="q8_0")
    path = derive_layerskip_draft(target, [0, 3], cache_dir=cache_dir)
    source = {t.name: t for t in gguf.GGUFReader(target).tensors}
    derived = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert derived["blk.1.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert bytes(derived["blk.1.ffn_down.weight"].data) == bytes(source["blk.3.ffn_down.weight"].data)
    llm = _load(path)
    try:
        assert llm.create_completion("hello", max_tokens=8, temperature=0)["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


def test_per_layer_metadata_arrays_are_sliced(tmp_path: Path, cache_dir: Path) -> None:
    # llama.cpp refuses a per-layer array whose length is not the block count.
    target = tinymodels.write_tiny_model(tmp_path / "arrays.gguf", n_layers=3, per_layer_arrays=True)
    path = derive_layerskip_draft(target, [0, 2], cache_dir=cache_dir)
    assert _field(path, "llama.feed_forward_length") == [128, 128]
    assert _field(path, "llama.attention.head_count_kv") == [2, 2]
    llm = _load(path)
    try:
        assert llm.create_completion("hello", max_tokens=8, temperature=0)["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


@pytest.mark.parametrize("keep", [[], [3], [-1], [0, 0]])
def test_bad_layer_lists_are_refused(tiny_target: Path, cache_dir: Path, keep: list[int]) -> None:
    with pytest.raises(UserInputError, match="layer"):
        derive_layerskip_draft(tiny_target, keep, cache_dir=cache_dir)


def test_missing_or_non_gguf_targets_are_refused(tmp_path: Path, cache_dir: Path) -> None:
    with pytest.raises(ModelFileError):
        derive_layerskip_draft(tmp_path / "absent.gguf", cache_dir=cache_dir)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelFileError):
        derive_layerskip_draft(junk, cache_dir=cache_dir)


CODE_PROMPT = (
    "<|im_start|>user\nWrite a Python function that parses a CSV file and returns the rows as "
    "dictionaries.<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.slow
def test_half_depth_qwen_draft_loads_and_drafts(
    qwen_target: Path, tmp_path_factory: pytest.TempPathFactory, record_property: Any
) -> None:
    path = derive_layerskip_draft(qwen_target, cache_dir=tmp_path_factory.mktemp("derived"))
    target = llama_cpp.Llama(model_path=str(qwen_target), n_ctx=512, logits_all=True, verbose=False)
    draft = _load(path)
    try:
        assert draft.metadata["qwen2.block_count"] == "14"
        assert draft.n_vocab() == target.n_vocab()
        prompt = target.tokenize(CODE_PROMPT.encode(), special=True)
        assert draft.tokenize(CODE_PROMPT.encode(), special=True) == prompt
        continuation = tinymodels.greedy_continuation(target, prompt, 64)
        agreed, total = tinymodels.greedy_agreement(draft, prompt, continuation)
        assert len(tinymodels.greedy_continuation(draft, prompt, 8)) > 0
    finally:
        draft.close()
        target.close()
    record_property("layerskip_acceptance", agreed / total)
    record_property("layerskip_bytes", path.stat().st_size)
    print(
        f"\nlayer-skip draft {path.name}: {path.stat().st_size:,} bytes, "
        f"greedy agreement {agreed}/{total} = {agreed / total:.0%}"
    )
