"""Tokenizer compatibility by llama.cpp's rule: the real models, and tiny GGUFs built on each edge."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import tinymodels
from test_gguf_info import shared_cache

from localspec.errors import TokenizerMismatchError
from localspec.models.compat import (
    SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
    CompatResult,
    Vocab,
    check_compat,
    compare_vocabs,
    vocab_of,
)
from localspec.models.gguf_info import GGUFInfo, read_gguf_info


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_cache(tmp_path_factory)


def info(path: Path, cache: Path | None = None) -> GGUFInfo:
    return read_gguf_info(path, cache_dir=cache)


# The real models.


@pytest.mark.slow
def test_real_qwen_pair_is_compatible(qwen_target: Path, qwen_draft: Path, real_cache: Path) -> None:
    target, draft = info(qwen_target, real_cache), info(qwen_draft, real_cache)
    assert check_compat(target, draft, cache_dir=real_cache).compatible
    # The same verdict token by token, not only through the equal fingerprints.
    full = compare_vocabs(vocab_of(target, cache_dir=real_cache), vocab_of(draft, cache_dir=real_cache))
    assert full == CompatResult(True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "draft", "reason"),
    [
        ("qwen_target", "smollm", "vocab sizes differ by 102784 (151936 vs 49152), more than 128"),
        ("qwen_target", "gemma", "vocab types differ (gpt2 vs llama)"),
        ("smollm", "gemma", "vocab types differ (gpt2 vs llama)"),
        ("gemma", "qwen_draft", "vocab types differ (llama vs gpt2)"),
    ],
)
def test_real_unrelated_models_are_refused(
    target: str, draft: str, reason: str, request: pytest.FixtureRequest, real_cache: Path
) -> None:
    result = check_compat(
        info(request.getfixturevalue(target), real_cache),
        info(request.getfixturevalue(draft), real_cache),
        cache_dir=real_cache,
    )
    assert result == CompatResult(False, reason)


# Tiny models on each edge of the rule.


def extra_tokens(n: int) -> tuple[str, ...]:
    return (tinymodels.IM_START, tinymodels.IM_END, *(f"<extra_{i}>" for i in range(n)))


def test_tiny_pair_is_compatible(tiny_target: Path, tiny_useless_draft: Path) -> None:
    assert check_compat(info(tiny_target), info(tiny_useless_draft)).compatible


def test_other_vocabulary_is_refused_naming_the_token(tiny_target: Path, tiny_other_vocab: Path) -> None:
    result = check_compat(info(tiny_target), info(tiny_other_vocab))
    assert not result.compatible
    assert result.reason is not None and result.reason.startswith("token ")


@pytest.mark.parametrize(("extra", "ok"), [(SPEC_VOCAB_MAX_SIZE_DIFFERENCE - 1, True), (129, False)])
def test_vocab_size_difference(tmp_path: Path, extra: int, ok: bool) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf")
    bigger = tinymodels.build_vocab(extra_tokens=extra_tokens(extra))
    draft = tinymodels.write_tiny_model(tmp_path / "d.gguf", vocab=bigger)
    n = len(tinymodels.build_vocab())
    result = check_compat(info(target), info(draft))
    assert result.compatible is ok
    if not ok:
        assert result.reason == f"vocab sizes differ by {extra} ({n} vs {n + extra}), more than 128"


@pytest.mark.parametrize(("add_bos", "ok"), [(False, True), (True, False)])
def test_bos_id_matters_only_when_bos_is_added(tmp_path: Path, add_bos: bool, ok: bool) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf", bos_id=1, add_bos=add_bos)
    draft = tinymodels.write_tiny_model(tmp_path / "d.gguf", bos_id=2, add_bos=add_bos)
    result = check_compat(info(target), info(draft))
    assert result == (CompatResult(True) if ok else CompatResult(False, "BOS ids differ (1 vs 2)"))


def test_add_bos_setting_must_match(tmp_path: Path) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf", add_bos=True)
    draft = tinymodels.write_tiny_model(tmp_path / "d.gguf", add_bos=False)
    result = check_compat(info(target), info(draft))
    assert result.reason == "one adds BOS and the other does not (target on, draft off)"


@pytest.mark.parametrize(("add_eos", "ok"), [(False, True), (True, False)])
def test_eos_id_matters_only_when_eos_is_added(tmp_path: Path, add_eos: bool, ok: bool) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf", eos_id=2, add_eos=add_eos)
    draft = tinymodels.write_tiny_model(tmp_path / "d.gguf", eos_id=1, add_eos=add_eos)
    assert check_compat(info(target), info(draft)).compatible is ok


def test_one_differing_token_text_is_refused(tmp_path: Path) -> None:
    vocab = tinymodels.build_vocab()
    index = vocab.id("▁hello")
    tokens = list(vocab.tokens)
    tokens[index] = "▁hallo"
    changed = dataclasses.replace(vocab, tokens=tuple(tokens))
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf")
    draft = tinymodels.write_tiny_model(tmp_path / "d.gguf", vocab=changed)
    result = check_compat(info(target), info(draft))
    assert result == CompatResult(False, f"token {index}: '▁hello' vs '▁hallo'")


def test_tokens_below_id_5_are_not_compared(tmp_path: Path) -> None:
    # llama.cpp starts at SPEC_VOCAB_CHECK_START_TOKEN_ID: ids 0-4 are special in most vocabularies.
    vocab = tinymodels.build_vocab()
    tokens = list(vocab.tokens)
    tokens[4] = "<not-a-byte>"
    changed = dataclasses.replace(vocab, tokens=tuple(tokens))
    target = tinymodels.write_tiny_model(tmp_path / "t.gguf")
    draft = tinymodels.write_tiny_model(tmp_path / "d.gguf", vocab=changed)
    assert check_compat(info(target), info(draft)).compatible


# The pure rule on plain lists.


def vocab(tokens: list[str], **changes: Any) -> Vocab:
    plain = Vocab(vocab_type="gpt2", add_bos=False, bos_id=0, add_eos=False, eos_id=1, tokens=tokens)
    return dataclasses.replace(plain, **changes)


def test_vocab_types_compare_as_llama_cpp_maps_them() -> None:
    tokens = [f"t{i}" for i in range(10)]
    # "gpt2" and "whitespace" are both BPE vocabularies to llama.cpp.
    assert compare_vocabs(vocab(tokens), vocab(tokens, vocab_type="whitespace")).compatible
    refused = compare_vocabs(vocab(tokens), vocab(tokens, vocab_type="llama"))
    assert refused.reason == "vocab types differ (gpt2 vs llama)"


def test_reason_shows_unusual_token_texts_readably() -> None:
    a = [f"t{i}" for i in range(10)]
    b = [*a[:7], "<｜end▁of▁sentence｜>", *a[8:]]
    a[7] = "<|endoftext|>"
    assert compare_vocabs(vocab(a), vocab(b)).reason == "token 7: '<|endoftext|>' vs '<｜end▁of▁sentence｜>'"


def test_raise_if_incompatible() -> None:
    CompatResult(True).raise_if_incompatible("t.gguf", "d.gguf")
    with pytest.raises(TokenizerMismatchError, match=r"draft d\.gguf cannot speculate for target t\.gguf: x"):
        CompatResult(False, "x").raise_if_incompatible("t.gguf", "d.gguf")
