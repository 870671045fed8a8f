"""Cancelling during prompt evaluation, on the tiny target: prompt decodes stop between chunks or
inside one (llama.cpp's abort callback), the KV cache stays consistent, and generation after a
cancelled prompt is the same as on a fresh model."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from cancelpoints import SetWhen

from localspec.engine.config import LoadOptions
from localspec.engine.llama import LlamaModel
from localspec.engine.speculative import FixedPolicy, Generation
from localspec.errors import RequestCancelledError
from localspec.types import GenerationResult, SamplingParams, TokenChunk

pytestmark = pytest.mark.timeout(120)

PROMPT = "the model is " * 700  # about 2100 tokens


def load(path: Path, n_batch: int) -> LlamaModel:
    return LlamaModel(path, LoadOptions(n_ctx=4096, n_threads=1, n_batch=n_batch))


def cached_positions(model: LlamaModel) -> int:
    """How many positions llama.cpp's cache holds for sequence 0 (pos_max + 1)."""
    return int(llama_cpp.llama_memory_seq_pos_max(model._memory, 0)) + 1


def generate(
    model: LlamaModel, prompt: list[int], cancel: threading.Event | None = None, reuse: int = 0
) -> tuple[GenerationResult, list[TokenChunk]]:
    gen = Generation(
        model,
        prompt,
        max_tokens=24,
        params=SamplingParams(),
        stop=(),
        policy=FixedPolicy(None, 0),
        method="none",
        k=0,
        cancel=cancel,
        reuse=reuse,
    )
    chunks = [chunk for chunk in gen.run() if chunk is not None]  # None: a turn, only where asked
    assert gen.result is not None
    return gen.result, chunks


def test_a_cancel_inside_one_chunk_aborts_the_graph_and_leaves_the_cache_empty(tiny_target: Path) -> None:
    model = load(tiny_target, n_batch=4096)  # the whole prompt in one chunk: only the callback can stop it
    try:
        tokens = model.tokenize(PROMPT)
        calls = 0

        def after_a_few_nodes() -> bool:
            nonlocal calls
            calls += 1
            return calls > 5  # the first check is before the chunk; the rest come from the graph

        with pytest.raises(RequestCancelledError):
            model.decode(tokens, 1, SetWhen(after_a_few_nodes))
        assert calls == 6  # llama.cpp asked during the compute and stopped at the first "yes"
        assert model.n_past == 0 and cached_positions(model) == 0
        model.decode(tokens, 1)  # the callback is gone: a decode without cancel runs as before
        after = model.logits(-1).copy()
        model.reset()
        model.decode(tokens, 1)
        np.testing.assert_array_equal(after, model.logits(-1))
    finally:
        model.close()


def test_a_cancel_between_chunks_keeps_the_chunks_already_decoded(tiny_target: Path) -> None:
    model = load(tiny_target, n_batch=256)
    try:
        tokens = model.tokenize(PROMPT)
        with pytest.raises(RequestCancelledError):
            model.decode(tokens, 1, SetWhen(lambda: model.n_past >= 512))
        assert model.n_past == 512 and cached_positions(model) == 512
    finally:
        model.close()


def test_a_cancelled_prompt_finishes_cancelled_with_no_tokens_and_the_model_still_generates(
    tiny_target: Path,
) -> None:
    model = load(tiny_target, n_batch=256)
    try:
        prompt = model.tokenize(PROMPT)
        fresh, _ = generate(model, prompt)
        assert fresh.token_ids

        already, chunks = generate(model, prompt, cancel=SetWhen(lambda: True))
        assert already.finish_reason == "cancelled" and chunks == [] and already.token_ids == ()
        assert already.stats.tokens == 0 and already.text == ""

        midway, chunks = generate(model, prompt, cancel=SetWhen(lambda: model.n_past >= 768))
        assert midway.finish_reason == "cancelled" and chunks == [] and midway.token_ids == ()
        assert model.n_past == 768 == cached_positions(model)
        # What the engine does next: reuse the cached prefix. The output is the fresh run's.
        reused, _ = generate(model, prompt, reuse=model.n_past)
        assert reused.stats.cached_tokens == 768
        assert reused.token_ids == fresh.token_ids
        again, _ = generate(model, prompt)
        assert again.token_ids == fresh.token_ids
    finally:
        model.close()


def test_a_cancel_from_another_thread_stops_a_long_prompt_promptly(tiny_target: Path) -> None:
    model = LlamaModel(tiny_target, LoadOptions(n_ctx=8192, n_threads=1, n_batch=8192))
    try:
        prompt = model.tokenize("the model is " * 2000)  # about 6000 tokens, one chunk
        start = time.perf_counter()
        model.decode(prompt, 1)
        full_s = time.perf_counter() - start
        cancel = threading.Event()
        threading.Timer(full_s / 10, cancel.set).start()
        start = time.perf_counter()
        result, chunks = generate(model, prompt, cancel=cancel)
        stopped_s = time.perf_counter() - start
        assert result.finish_reason == "cancelled" and chunks == []
        assert stopped_s < full_s / 2, (stopped_s, full_s)
        assert model.n_past == 0 == cached_positions(model)
    finally:
        model.close()
