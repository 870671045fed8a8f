"""The tiny models are real enough: llama.cpp loads them, tokenizes, chats and generates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import pytest
import tinymodels

PROMPTS = (
    "hello world",
    "def main(self):",
    "the model is",
    "print the code",
    "import numpy as np",
    "for i in range(10):",
    "what is the next token",
    "we write a test",
    "class Draft:",
    "one two three",
    "you can use the fast model",
    "return None",
    "if x is not None:",
    "the first line of the file",
    "The quick brown fox",
    "Once upon a time",
)


def _load(path: Path) -> Any:
    # One thread: a tiny model gains nothing from more, and spinning threads crawl on a busy machine.
    return llama_cpp.Llama(model_path=str(path), n_ctx=512, logits_all=True, n_threads=1, verbose=False)


def _field(path: Path, key: str) -> Any:
    field = gguf.GGUFReader(path).get_field(key)
    assert field is not None, key
    return field.contents()


@pytest.fixture(scope="module")
def target(tiny_target: Path) -> Iterator[Any]:
    llm = _load(tiny_target)
    yield llm
    llm.close()


Continuations = list[tuple[list[int], list[int]]]


@pytest.fixture(scope="module")
def continuations(target: Any) -> Continuations:
    """(prompt tokens, the target's greedy continuation, up to 64 tokens) for each prompt."""
    out = []
    for prompt in PROMPTS:
        tokens = target.tokenize(prompt.encode())
        out.append((tokens, tinymodels.greedy_continuation(target, tokens, 64)))
    return out


def _acceptance(continuations: Continuations, draft_path: Path) -> float:
    draft = _load(draft_path)
    try:
        agreed = total = 0
        for prompt, continuation in continuations:
            a, n = tinymodels.greedy_agreement(draft, prompt, continuation)
            agreed, total = agreed + a, total + n
    finally:
        draft.close()
    return agreed / total


@pytest.mark.parametrize(
    ("fixture", "name", "layers"),
    [
        ("tiny_target", "tiny-target", 3),
        ("tiny_perfect_draft", "tiny-perfect-draft", 3),
        ("tiny_useless_draft", "tiny-useless-draft", 2),
        ("tiny_related_draft", "tiny-related-draft", 3),
        ("tiny_other_vocab", "tiny-other-vocab", 2),
    ],
)
def test_named_models_load(request: pytest.FixtureRequest, fixture: str, name: str, layers: int) -> None:
    path: Path = request.getfixturevalue(fixture)
    llm = _load(path)
    try:
        assert llm.metadata["general.name"] == name
        assert llm.metadata["llama.block_count"] == str(layers)
        assert llm.metadata["tokenizer.chat_template"] == tinymodels.CHATML_TEMPLATE
        assert llm.create_completion("hello", max_tokens=4, temperature=0)["choices"][0]["text"]
    finally:
        llm.close()


def test_same_arguments_write_the_same_bytes(tmp_path: Path) -> None:
    a = tinymodels.write_tiny_model(tmp_path / "a.gguf", seed=3, n_layers=2)
    b = tinymodels.write_tiny_model(tmp_path / "b.gguf", seed=3, n_layers=2)
    c = tinymodels.write_tiny_model(tmp_path / "c.gguf", seed=4, n_layers=2)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))


def test_options_reach_the_file(tmp_path: Path) -> None:
    vocab = tinymodels.build_vocab(extra_tokens=("<|im_start|>", "<|im_end|>", "<|fim|>"))
    path = tinymodels.write_tiny_model(
        tmp_path / "m.gguf", n_layers=4, n_ctx=256, vocab=vocab, bos_id=2, add_bos=False, dtype="f16"
    )
    assert _field(path, "llama.block_count") == 4
    assert _field(path, "llama.context_length") == 256
    assert _field(path, "tokenizer.ggml.bos_token_id") == 2
    assert _field(path, "tokenizer.ggml.eos_token_id") == vocab.id("<|im_end|>")
    assert _field(path, "tokenizer.ggml.tokens")[-1] == "<|fim|>"
    types = {t.tensor_type for t in gguf.GGUFReader(path).tensors if t.name.endswith("attn_q.weight")}
    assert types == {gguf.GGMLQuantizationType.F16}
    llm = _load(path)
    try:
        assert llm.tokenize(b"hello")[0] != 2  # add_bos=False
        assert llm.create_completion("hello", max_tokens=8, temperature=0)["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "def main(self):\n    return None",
        "naïve café 世界 🙂",
        " two  spaces\tand tab",
        "x=[1]",
    ],
)
def test_tokenization_round_trips(target: Any, text: str) -> None:
    # SentencePiece adds a leading space; detokenizing after <s> takes it off again.
    tokens = target.tokenize(text.encode())
    assert tokens[0] == target.token_bos()
    assert target.detokenize(tokens).decode() == text


def test_words_become_single_tokens(target: Any) -> None:
    assert len(target.tokenize(b"hello world python", add_bos=False)) == 3


def test_chat_template_special_tokens_tokenize_as_one(target: Any) -> None:
    vocab = tinymodels.build_vocab()
    tokens = target.tokenize(b"<|im_start|>user\nhi<|im_end|>", add_bos=False, special=True)
    assert tokens[0] == vocab.id(tinymodels.IM_START)
    assert tokens[-1] == vocab.id(tinymodels.IM_END) == target.token_eos()


def test_chat_completion_uses_the_template(target: Any) -> None:
    messages = [{"role": "user", "content": "write the code"}]
    result = target.create_chat_completion(messages=messages, max_tokens=24, temperature=0)
    assert result["choices"][0]["finish_reason"] in {"stop", "length"}
    assert result["usage"]["prompt_tokens"] > 5


def test_greedy_generation_is_deterministic_and_varied(
    tiny_target: Path, continuations: Continuations
) -> None:
    other = _load(tiny_target)
    try:
        for prompt, continuation in continuations[:4]:
            assert tinymodels.greedy_continuation(other, prompt, 64) == continuation
    finally:
        other.close()
    long_ones = [c for _, c in continuations if len(c) == 64]
    assert long_ones, "every run stopped early"
    assert all(len(set(c)) >= 12 for c in long_ones), "a run repeats a few tokens forever"


def test_some_greedy_runs_stop_on_eos(target: Any, continuations: Continuations) -> None:
    stopped = [c for _, c in continuations if len(c) < 64]
    assert 0 < len(stopped) < len(continuations)
    assert all(c[-1] == target.token_eos() for c in stopped)


def test_generated_text_is_words(target: Any) -> None:
    text = target.create_completion("the model is", max_tokens=32, temperature=0)["choices"][0]["text"]
    words = text.split()
    assert len(words) >= 10
    assert sum(w.isalpha() for w in words) >= len(words) // 2, text


def test_perfect_draft_generates_what_the_target_generates(
    continuations: Continuations, tiny_perfect_draft: Path
) -> None:
    draft = _load(tiny_perfect_draft)
    try:
        for prompt, continuation in continuations[:6]:
            assert tinymodels.greedy_continuation(draft, prompt, 64) == continuation
    finally:
        draft.close()
    assert _acceptance(continuations, tiny_perfect_draft) == 1.0


def test_related_draft_agrees_often_but_not_always(
    continuations: Continuations, tiny_related_draft: Path
) -> None:
    assert 0.3 < _acceptance(continuations, tiny_related_draft) < 0.9


def test_useless_draft_rarely_agrees(continuations: Continuations, tiny_useless_draft: Path) -> None:
    assert _acceptance(continuations, tiny_useless_draft) < 0.1


def test_other_vocab_differs_from_the_target(tiny_target: Path, tiny_other_vocab: Path) -> None:
    ours = _field(tiny_target, "tokenizer.ggml.tokens")
    theirs = _field(tiny_other_vocab, "tokenizer.ggml.tokens")
    assert len(ours) != len(theirs)
    assert ours[:300] == theirs[:300]  # control and byte tokens agree; the words do not
    assert ours[300:] != theirs[300:]


def test_load_and_32_tokens_take_well_under_a_second(tiny_target: Path) -> None:
    start = time.perf_counter()
    llm: Any = llama_cpp.Llama(model_path=str(tiny_target), n_ctx=256, n_threads=1, verbose=False)
    result = llm.create_completion("the model is", max_tokens=32, temperature=0)
    elapsed = time.perf_counter() - start
    llm.close()
    assert result["usage"]["completion_tokens"] > 0
    assert elapsed < 1.0  # about 0.02 s on an idle 2-core machine
