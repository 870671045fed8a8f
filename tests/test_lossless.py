"""Fast loading (the default) is lossless up to rounding, and the check that says so can fail.

Every method runs against the target alone on llama.cpp's own loading; each divergence must
be one the measured rounding margin of the batched kernels explains (engine.lossless). The
sampled case keeps its distribution test. The real pair's run is `scripts/lossless_check.py`
(numbers in docs/benchmarks.md) and one slow test here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_engine import PROMPTS, _same_distribution, _second_and_third, make_engine, run

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.llama import LlamaModel
from localspec.engine.lossless import explain, first_divergence, rounding_margin, top_two_gap
from localspec.engine.prompting import prompt_tokens
from localspec.engine.worker import Engine
from localspec.types import ChatMessage, GenerationRequest, Method, SpecParams

FAST = LoadOptions(n_ctx=1024, n_threads=1)  # llama.cpp's own loading: the default


def test_first_divergence_and_top_two_gap() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # one stopped early
    assert first_divergence([], []) is None
    assert top_two_gap(np.array([0.5, 3.0, 2.25, -1.0], dtype=np.float32)) == pytest.approx(0.75)


@pytest.fixture(scope="module")
def fast_target(tiny_target: Path) -> Iterator[LlamaModel]:
    model = LlamaModel(tiny_target, FAST)
    yield model
    model.close()


@pytest.fixture(scope="module")
def fast_related(tiny_target: Path, tiny_related_draft: Path) -> Iterator[Engine]:
    with make_engine(tiny_target, tiny_related_draft, FAST) as engine:
        yield engine


@pytest.fixture(scope="module")
def margin(fast_target: LlamaModel) -> float:
    prompt = fast_target.tokenize(PROMPTS[0])
    return max(rounding_margin(fast_target, prompt, 24, batch) for batch in (2, 4, 7))


@pytest.mark.parametrize("method", ["draft", "ngram", "layerskip", "auto"])
def test_every_divergence_in_fast_mode_is_a_near_tie(
    fast_related: Engine, fast_target: LlamaModel, margin: float, method: Method
) -> None:
    assert fast_related.config.load.batch_invariant is False
    for prompt in PROMPTS:
        base = run(fast_related, prompt, "none", max_tokens=48)
        spec = run(fast_related, prompt, method, 6, max_tokens=48)
        assert not base.stats.exact and not spec.stats.exact
        tokens = prompt_tokens(fast_target, GenerationRequest(prompt=prompt))
        divergence = explain(fast_target, tokens, base.token_ids, spec.token_ids, margin)
        assert divergence is None or divergence.explained, (prompt, method, divergence)


def test_a_divergence_past_the_margin_is_reported_unexplained(fast_target: LlamaModel, margin: float) -> None:
    # A made-up output that takes the target's least likely token at position 3: no rounding does that.
    prompt = fast_target.tokenize(PROMPTS[1])
    alone = []
    fast_target.reset()
    fast_target.decode(prompt)
    for _ in range(6):
        alone.append(int(fast_target.logits(-1).argmax()))
        fast_target.decode([alone[-1]])
    fast_target.reset()
    fast_target.decode(prompt)
    for token in alone[:3]:
        fast_target.decode([token])
    worst = int(fast_target.logits(-1).argmin())
    got = [*alone[:3], worst, *alone[4:]]
    divergence = explain(fast_target, prompt, alone, got, margin)
    assert divergence is not None and divergence.position == 3
    assert divergence.alone == alone[3] and divergence.got == worst
    assert divergence.gap > margin and not divergence.explained
    assert divergence.top_two_gap <= divergence.gap
    assert json.dumps(divergence.to_dict())


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_sampled_tokens_follow_the_target_distribution_in_fast_mode(
    fast_related: Engine, method: Method
) -> None:
    base = _second_and_third(fast_related, "none", 2000)
    spec = _second_and_third(fast_related, method, 2000)
    for a, b in zip(base, spec, strict=True):
        assert sum(b.values()) > 1500
        assert _same_distribution(a, b) > 1e-3


@pytest.mark.slow
def test_qwen_pair_fast_divergences_are_all_explained(qwen_target: Path, qwen_draft: Path) -> None:
    bench = json.loads((Path(__file__).resolve().parents[1] / "scripts" / "bench_prompts.json").read_text())
    load = LoadOptions(n_ctx=2048)
    checker = LlamaModel(qwen_target, load)
    # Prompts read by the plain copy, as where the load-time check finds it faster (on this CPU it
    # flips between loads): its cache hand-over is part of what must stay within rounding. Method
    # "none" as the default: each request names its own, and auto's calibration is not needed.
    engine_load = replace(load, plain_prefill=True)
    config = EngineConfig(qwen_target, qwen_draft, load=engine_load, method="none", ngram_memory_tokens=0)
    try:
        with Engine(config) as engine:
            engine.wait_ready()
            assert engine.info.plain_prefill
            first = prompt_tokens(checker, _chat(bench["fix_bug"], "none"))
            margin = max(rounding_margin(checker, first, 16, batch) for batch in (4, 8))
            assert 0.0 < margin < 1.0  # repacked kernels do round differently, and only a little
            for name in ("fix_bug", "prose_explain"):
                base = engine.generate(_chat(bench[name], "none"))
                for method in ("draft", "ngram"):
                    spec = engine.generate(_chat(bench[name], method))
                    tokens = prompt_tokens(checker, _chat(bench[name], "none"))
                    divergence = explain(checker, tokens, base.token_ids, spec.token_ids, margin)
                    assert divergence is None or divergence.explained, (name, method, divergence)
    finally:
        checker.close()


def _chat(text: str, method: Method) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage("user", text),),
        max_tokens=32,
        speculative=SpecParams(method, 4),
        cache_prompt=False,
    )
