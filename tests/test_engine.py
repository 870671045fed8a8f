"""The engine against real llama.cpp on tiny models: lossless for every method, and every edge.

Greedy output must be token-identical to `none`; sampled output must follow the
target's distribution (chi-square against `none`); failures must cost nothing but speed.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from localspec.engine.config import EXACT_POSITIONS, EngineConfig, LoadOptions
from localspec.engine.drafters.base import Draft
from localspec.engine.llama import LlamaModel
from localspec.engine.sampling import Draws
from localspec.engine.speculative import FixedPolicy, Generation
from localspec.engine.worker import Engine
from localspec.errors import ContextOverflowError, UserInputError
from localspec.types import DEFAULT_K, GenerationRequest, GenerationResult, Method, SamplingParams, SpecParams

PROMPTS = [
    "the cat sat on",
    "def add(a, b):\n    return",
    "one two three one two",
    "hello world",
    "import numpy as np\n",
    "the quick brown fox jumps over the lazy dog",
    "a b c d e f g",
    "for i in range(10):",
    "class Foo:\n    def",
    "let us write some code",
]
# Tiny models run far faster on one thread, and stay fast while other tests load the CPU.
TINY = LoadOptions(n_ctx=1024, n_threads=1, batch_invariant=True)  # --exact: bit-identity is asserted


def make_engine(target: Path, draft: Path | None = None, load: LoadOptions = TINY) -> Engine:
    # No confidence floor: these tests look at every drafted token's verification. No memory of
    # earlier requests: each method runs after `none` on the same prompt, and would copy its output.
    config = EngineConfig(
        target=target, draft=draft, load=load, draft_min_confidence=0.0, ngram_memory_tokens=0
    )
    engine = Engine(config)
    engine.wait_ready()
    return engine


def run(engine: Engine, prompt: str, method: Method, k: int | None = 4, **kw: object) -> GenerationResult:
    """A fresh evaluation of the prompt (no KV reuse), as the target alone would compute it."""
    kw.setdefault("cache_prompt", False)
    request = GenerationRequest(prompt=prompt, speculative=SpecParams(method, k), **kw)  # type: ignore[arg-type]
    return engine.generate(request)


def decode_alone(
    model: LlamaModel, prompt: str, choose: Callable[[np.ndarray, list[int]], int | None]
) -> list[int]:
    """The target alone from `prompt`, one token at a time: `choose(logits, sequence so far)` gives
    each next token (None: stop). The reply's tokens."""
    sequence = model.tokenize(prompt)
    start = len(sequence)
    model.reset()
    model.decode(sequence, 1)
    while (token := choose(model.logits(-1).copy(), sequence)) is not None:
        sequence.append(token)
        model.decode([token], 1)
    return sequence[start:]


@pytest.fixture(scope="module")
def related(tiny_target: Path, tiny_related_draft: Path) -> Iterator[Engine]:
    with make_engine(tiny_target, tiny_related_draft) as engine:
        yield engine


@pytest.fixture(scope="module")
def useless(tiny_target: Path, tiny_useless_draft: Path) -> Iterator[Engine]:
    with make_engine(tiny_target, tiny_useless_draft) as engine:
        yield engine


@pytest.mark.parametrize("drafts", ["perfect", "related", "useless"])
@pytest.mark.parametrize("method", ["draft", "ngram", "layerskip", "auto"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_is_token_identical_to_none(
    request: pytest.FixtureRequest, drafts: str, method: Method, k: int
) -> None:
    engine: Engine = request.getfixturevalue(drafts)
    for prompt in PROMPTS:
        base = run(engine, prompt, "none", max_tokens=64)
        spec = run(engine, prompt, method, k, max_tokens=64)
        assert spec.token_ids == base.token_ids, prompt
        assert spec.text == base.text
        assert spec.finish_reason == base.finish_reason
        assert spec.stats.fallback_reason is None


def test_drafts_really_run_and_acceptance_tracks_draft_quality(
    perfect: Engine, related: Engine, useless: Engine
) -> None:
    rates = {}
    for name, engine in [("perfect", perfect), ("related", related), ("useless", useless)]:
        drafted = accepted = 0
        for prompt in PROMPTS:
            stats = run(engine, prompt, "draft", 4, max_tokens=48).stats
            drafted += stats.drafted
            accepted += stats.accepted
            assert sum(stats.drafted_by_position) == stats.drafted
            assert sum(stats.accepted_by_position) == stats.accepted
        rates[name] = accepted / drafted
    assert rates["perfect"] == 1.0
    assert 0.3 < rates["related"] < 0.95
    assert rates["useless"] < 0.1


def test_the_confidence_floor_keeps_a_draft_models_unsure_guesses_out(
    tiny_target: Path, tiny_related_draft: Path, related: Engine
) -> None:
    floored = Engine(
        EngineConfig(target=tiny_target, draft=tiny_related_draft, load=TINY, draft_min_confidence=0.75)
    )
    with floored:
        floored.wait_ready()
        drafted = {"floor": 0, "none": 0}
        accepted = {"floor": 0, "none": 0}
        for prompt in PROMPTS:
            for name, engine in (("floor", floored), ("none", related)):
                spec = run(engine, prompt, "draft", 4, max_tokens=48)
                assert spec.token_ids == run(engine, prompt, "none", max_tokens=48).token_ids
                drafted[name] += spec.stats.drafted
                accepted[name] += spec.stats.accepted
    assert 0 < drafted["floor"] < drafted["none"]
    assert accepted["floor"] / drafted["floor"] > accepted["none"] / drafted["none"]


def test_stats_report_the_k_cap_and_the_mean_k_drafted(perfect: Engine) -> None:
    full = 0
    for k, cap in ((None, DEFAULT_K), (3, 3)):
        for method, max_tokens in (("draft", 400), ("ngram", 64)):
            for prompt in PROMPTS:
                st = run(perfect, prompt, method, k, max_tokens=max_tokens).stats  # type: ignore[arg-type]
                assert st.k == cap
                if not st.drafted:
                    assert st.mean_k == 0.0
                    continue
                assert 1.0 <= st.mean_k <= cap
                # Ended on EOS, short of max_tokens and of the positions where --exact verifies one
                # token at a time: no step was cut short, so the perfect draft drafted k at every step
                # (near-ties end verifies early, not drafts).
                ended = st.prompt_tokens + st.tokens
                if method == "draft" and st.tokens <= 400 - cap - 1 and ended < EXACT_POSITIONS - cap:
                    assert st.mean_k == cap
                    full += 1
    assert full >= 4  # the case was really exercised
    plain = run(perfect, "hello world", "none", None, max_tokens=8).stats
    assert (plain.k, plain.mean_k) == (0, 0.0)


def test_eos_inside_the_draft(perfect: Engine) -> None:
    stopped = 0
    for prompt in PROMPTS:
        base = run(perfect, prompt, "none", max_tokens=400)
        if base.finish_reason == "stop":
            stopped += 1
        for k in (2, 5, 8):
            spec = run(perfect, prompt, "draft", k, max_tokens=400)
            assert (spec.token_ids, spec.finish_reason) == (base.token_ids, base.finish_reason)
    assert stopped >= 3  # the edge case was really exercised


def test_stop_string_inside_the_draft(perfect: Engine, related: Engine) -> None:
    for prompt in PROMPTS[:6]:
        full = run(perfect, prompt, "none", max_tokens=64).text
        stop = full[20:23]
        assert len(stop) == 3
        base = run(perfect, prompt, "none", max_tokens=64, stop=(stop,))
        assert base.text == full[: full.index(stop)]
        assert base.finish_reason == "stop"
        for engine, method in [(perfect, "draft"), (related, "draft"), (perfect, "ngram")]:
            spec = run(engine, prompt, method, 5, max_tokens=64, stop=(stop,))  # type: ignore[arg-type]
            assert (spec.text, spec.finish_reason) == (base.text, "stop")


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 6, 7])
def test_max_tokens_reached_mid_draft(perfect: Engine, max_tokens: int) -> None:
    prompt = "let us write some code"
    base = run(perfect, prompt, "none", max_tokens=max_tokens)
    assert len(base.token_ids) == max_tokens and base.finish_reason == "length"
    for k in (3, 4, 8):
        spec = run(perfect, prompt, "draft", k, max_tokens=max_tokens)
        assert spec.token_ids == base.token_ids
        assert spec.finish_reason == "length"


def test_context_limit_reached_inside_the_draft(tiny_target: Path, tiny_perfect_draft: Path) -> None:
    small = LoadOptions(n_ctx=256, n_threads=1)
    with make_engine(tiny_target, tiny_perfect_draft, small) as engine:
        prompt = "let us write some code " * 20
        base = run(engine, prompt, "none", max_tokens=500)
        assert base.finish_reason == "length"
        # Every position of the context is used; the last token is sampled, never decoded.
        assert base.stats.prompt_tokens + len(base.token_ids) == engine.info.n_ctx + 1
        for method in ("draft", "ngram"):
            for k in (3, 7):
                spec = run(engine, prompt, method, k, max_tokens=500)
                assert (spec.token_ids, spec.finish_reason) == (base.token_ids, "length")


def test_a_following_turn_reuses_the_shared_prefix(related: Engine) -> None:
    first = run(related, "hello world", "draft", 4, max_tokens=24, cache_prompt=True)
    follow_up = "hello world" + first.text + " and then"
    cached = run(related, follow_up, "draft", 4, max_tokens=24, cache_prompt=True)
    fresh = run(related, follow_up, "draft", 4, max_tokens=24)
    assert cached.stats.cached_tokens >= first.stats.prompt_tokens
    assert fresh.stats.cached_tokens == 0
    assert cached.token_ids == fresh.token_ids
    again = run(related, follow_up, "none", 4, max_tokens=24, cache_prompt=True)
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1
    assert again.token_ids == fresh.token_ids


def test_prompt_longer_than_the_context_is_refused_with_both_numbers(tiny_target: Path) -> None:
    with make_engine(tiny_target, load=LoadOptions(n_ctx=256, n_threads=1)) as engine:
        with pytest.raises(ContextOverflowError) as err:
            run(engine, "word " * 400, "none")
        assert err.value.n_ctx == engine.info.n_ctx and err.value.n_prompt > engine.info.n_ctx
        assert str(err.value.n_ctx) in err.value.message and str(err.value.n_prompt) in err.value.message
        assert run(engine, "hello", "none", max_tokens=4).token_ids  # still serving


def test_a_context_smaller_than_a_batch_reads_a_prompt_longer_than_it_asked_for(tiny_target: Path) -> None:
    # llama.cpp lowers n_batch to a smaller context and aborts the whole process on a larger batch
    # (GGML_ASSERT n_tokens_all <= n_batch): `generate --ctx 64` crashed on its first prompt. In a
    # child process, so that a crash is this test's failure, not the test run's.
    code = (
        "import sys; from pathlib import Path; from localspec.engine.config import LoadOptions; "
        "from localspec.engine.llama import LlamaModel; "
        "m = LlamaModel(Path(sys.argv[1]), LoadOptions(n_ctx=64, n_threads=1)); "
        "m.decode(list(range(1, 101)), 1); print(m.n_past)"
    )
    run = [sys.executable, "-c", code, str(tiny_target)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "100"  # llama.cpp pads the context to 256, its batch stays 64


def test_an_empty_prompt_is_refused_not_continued_from_a_stale_row(perfect: Engine) -> None:
    # A tokenizer without BOS turns "" into no tokens; llama.cpp then hands back a row of logits no
    # decode of this prompt wrote, and a reply was drawn from it.
    for request in (
        GenerationRequest(prompt_ids=(), max_tokens=4),
        GenerationRequest(prompt_ids=(), max_tokens=0, prompt_logprobs=1),
    ):
        with pytest.raises(UserInputError, match="the prompt is empty"):
            perfect.generate(request)
    assert perfect.generate(GenerationRequest(prompt_ids=(1, 2), max_tokens=2)).token_ids  # still serving


def test_no_thread_that_ran_llama_cpp_outlives_its_work(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama.cpp's OpenMP keeps a team of threads for each thread that ran it until that thread ends;
    # an idle engine keeping one slowed another engine's steps by 40% (docs/benchmarks.md, session 27).
    ran: set[threading.Thread] = set()
    real = LlamaModel.decode

    def decode(self: LlamaModel, *args: object, **kwargs: object) -> float:
        ran.add(threading.current_thread())
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaModel, "decode", decode)
    with make_engine(tiny_target) as engine:
        assert run(engine, "hello", "none", max_tokens=4).token_ids
        assert run(engine, "hello", "auto", max_tokens=4).token_ids  # calibrates: more decodes
        assert ran
        for thread in ran:
            thread.join(timeout=10)
        assert not [t.name for t in ran if t.is_alive()]
        assert run(engine, "hello", "none", max_tokens=4).token_ids  # and it still serves


def test_seed_reproduces_sampled_output(related: Engine) -> None:
    def sampled(method: Method, seed: int) -> tuple[int, ...]:
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        return run(related, "hello world", method, 4, max_tokens=32, sampling=params).token_ids

    for method in ("none", "draft", "ngram"):
        assert sampled(method, 7) == sampled(method, 7)
    assert len({sampled("draft", seed) for seed in range(5)}) > 1


def _second_and_third(engine: Engine, method: Method, n: int) -> tuple[Counter[int], Counter[int]]:
    second: Counter[int] = Counter()
    third: Counter[int] = Counter()
    for seed in range(n):
        params = SamplingParams(temperature=1.0, seed=seed + (0 if method == "none" else 10**6))
        ids = run(engine, "the cat sat on", method, 3, max_tokens=3, sampling=params).token_ids
        if len(ids) == 3:
            second[ids[1]] += 1
            third[ids[2]] += 1
    return second, third


def _same_distribution(a: Counter[int], b: Counter[int]) -> float:
    keys = sorted(set(a) | set(b))
    table = np.array([[a[k] for k in keys], [b[k] for k in keys]], dtype=float)
    # Pool rare categories so every expected count is large enough for chi-square.
    common = table.sum(axis=0) >= 20
    pooled = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
    pooled = pooled[:, pooled.sum(axis=0) > 0]
    return float(stats.chi2_contingency(pooled).pvalue)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_sampled_tokens_follow_the_target_distribution(related: Engine, method: Method) -> None:
    base = _second_and_third(related, "none", 2000)
    spec = _second_and_third(related, method, 2000)
    for a, b in zip(base, spec, strict=True):
        assert sum(b.values()) > 1500
        assert _same_distribution(a, b) > 1e-3


def test_sampled_drafts_are_really_verified(related: Engine) -> None:
    params = SamplingParams(temperature=1.0, seed=1)
    stats_ = run(related, "hello world", "draft", 4, max_tokens=64, sampling=params).stats
    assert stats_.drafted > 0 and 0 < stats_.accepted < stats_.drafted


def test_cancel_from_another_thread_stops_within_a_step(tiny_target: Path) -> None:
    with make_engine(tiny_target, load=LoadOptions(n_ctx=4096, n_threads=1)) as engine:
        handle = engine.submit(GenerationRequest(prompt="if x > 0:\n    print(x)\nelse:", max_tokens=4000))
        chunks = iter(handle)
        next(chunks)
        threading.Thread(target=handle.cancel).start()
        rest = list(chunks)
        assert handle.result is not None
        assert handle.result.finish_reason == "cancelled"
        assert len(handle.result.token_ids) < 4000
        assert len(rest) < 3000
        assert len(run(engine, "hello world", "none", max_tokens=4).token_ids) == 4


def test_mismatched_draft_is_refused_and_the_target_serves_alone(
    tiny_target: Path, tiny_other_vocab: Path
) -> None:
    with make_engine(tiny_target, tiny_other_vocab) as engine:
        assert engine.info.draft_error is not None
        assert "cannot speculate" in engine.info.draft_error
        base = run(engine, "hello world", "none", max_tokens=32)
        spec = run(engine, "hello world", "draft", 4, max_tokens=32)
        assert spec.token_ids == base.token_ids
        assert spec.stats.fallback_reason is not None
        assert "draft unavailable" in spec.stats.fallback_reason


def test_draft_that_cannot_load_leaves_the_target_serving(tiny_target: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_target.read_bytes()[:5000])
    with make_engine(tiny_target, broken) as engine:
        assert engine.info.draft_error
        result = run(engine, "hello world", "draft", 4, max_tokens=16)
        assert len(result.token_ids) == 16
        assert result.stats.method == "none"


class _FailingDrafter:
    """Wraps a real drafter and raises on its third proposal, as a crashing draft would."""

    name = "draft"

    def __init__(self, model: LlamaModel) -> None:
        from localspec.engine.drafters.model import ModelDrafter

        self.inner = ModelDrafter(model)
        self.calls = 0

    def start(self, prompt: list[int], fresh: bool = True) -> None:
        self.inner.start(prompt, fresh)

    def propose(self, tokens: list[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("draft model crashed")
        return self.inner.propose(tokens, k, params, draws)


def test_draft_failing_mid_generation_falls_back_to_the_target(
    tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    target = LlamaModel(tiny_target, TINY)
    draft = LlamaModel(tiny_perfect_draft, TINY)
    prompt = target.tokenize("let us write some code")

    def generate(policy: FixedPolicy) -> Generation:
        gen = Generation(
            target,
            prompt,
            max_tokens=64,
            params=SamplingParams(),
            stop=(),
            policy=policy,
            method="draft",
            k=4,
        )
        list(gen.run())
        return gen

    base = generate(FixedPolicy(None, 0))
    failing = generate(FixedPolicy(_FailingDrafter(draft), 4))  # type: ignore[arg-type]
    assert failing.result is not None and base.result is not None
    assert failing.result.token_ids == base.result.token_ids
    assert failing.stats.fallback_reason == "draft failed: draft model crashed"
    assert failing.stats.drafted > 0
    target.close()
    draft.close()


def test_ngram_drafts_from_what_earlier_requests_wrote(tiny_target: Path) -> None:
    prompt = "the quick brown fox jumps over the lazy dog"
    for tokens, drafts_again in ((16384, True), (0, False)):
        config = EngineConfig(target=tiny_target, load=TINY, ngram_memory_tokens=tokens)
        with Engine(config) as engine:
            first = run(engine, prompt, "ngram", max_tokens=48)
            again = run(engine, prompt, "ngram", max_tokens=48)
        assert again.token_ids == first.token_ids
        if drafts_again:  # the second time, the first reply is there to copy
            assert again.stats.accepted > first.stats.accepted + 16, (first.stats, again.stats)
        else:
            assert again.stats.drafted == first.stats.drafted


def test_a_request_submitted_without_streaming_delivers_only_its_result(perfect: Engine) -> None:
    request = GenerationRequest(prompt="the cat sat on", max_tokens=24, speculative=SpecParams("draft", 3))
    streamed = perfect.submit(request)
    chunks = list(streamed)
    assert chunks and streamed.result is not None
    quiet = perfect.submit(request, stream=False)
    assert list(quiet) == []  # the first event is already the result
    assert quiet.result is not None and quiet.result.token_ids == streamed.result.token_ids
    assert quiet.result.text == "".join(c.text for c in chunks)
