"""Earlier conversations' caches kept in memory (engine.promptcache): the bookkeeping on plain
token tuples, then the engine on the tiny target going back to a conversation another
request came between."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest
from test_engine import TINY

from localspec.engine.config import LONG_CONTEXT, EngineConfig, LoadOptions, flash_attention
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.llama import LlamaModel
from localspec.engine.promptcache import (
    GIB,
    MIN_GAIN_TOKENS,
    MIN_SAVED_TOKENS,
    PromptCache,
    Saved,
    default_limit,
)
from localspec.engine.worker import Engine
from localspec.errors import ConfigError, LocalspecError, UnsupportedModelError
from localspec.resolve import prompt_cache_bytes
from localspec.settings import load_settings
from localspec.types import GenerationRequest, GenerationResult, Method, SpecParams


def saved(tokens: range | list[int], size: int = 10) -> Saved:
    return Saved(tuple(tokens), object(), size)


def test_a_cache_is_worth_saving_where_a_prompt_would_drop_enough_of_it() -> None:
    cache = PromptCache(1000)
    live = list(range(MIN_SAVED_TOKENS + 10))
    assert cache.worth_saving(live, 10)
    assert not cache.worth_saving(live, 11)  # less than MIN_SAVED_TOKENS would be lost
    cache.add(saved(range(MIN_SAVED_TOKENS + 20)))
    assert not cache.worth_saving(live, 0)  # a saved cache holds it already
    assert not PromptCache(0).worth_saving(live, 0)


def test_the_same_conversation_cut_further_is_not_saved() -> None:
    """A long chat whose oldest messages went (server.truncation): the live cache is its earlier
    cut, which no request will ask for again; another conversation's is saved."""
    cache = PromptCache(1 << 20)
    system, a, b, c = range(10), range(100, 300), range(300, 600), range(600, 700)
    live = [*system, *a, *b, *c]
    cut = [*system, *b, *c, *range(700, 720)]
    assert not cache.worth_saving(live, 10, cut)
    other = [*system, *range(1000, 1300)]
    assert cache.worth_saving(live, 10, other)
    assert cache.worth_saving(live, 10, [*system, *b[:40]])  # too little of it to tell: saved
    # A match that straddles two tokens' bytes is no match.
    assert cache.worth_saving([*system, *[256 * 256] * 300], 10, [*system, *[1] * 64])


def test_a_saved_cache_replaces_those_it_extends_and_the_oldest_go_past_the_limit() -> None:
    cache = PromptCache(100)
    cache.add(saved(range(5), 30))
    cache.add(saved(range(10), 30))  # extends the first: it replaces it
    assert len(cache) == 1 and cache.size == 30
    cache.add(saved([7, 8, 9], 30))
    cache.add(saved([4, 4, 4], 30))
    assert cache.best(list(range(100)), 0) is None  # 10 shared: not MIN_GAIN_TOKENS
    cache.add(saved([1, 1, 1], 30))  # 120 bytes: the least recently used goes
    assert len(cache) == 3 and cache.size == 90
    assert tuple(range(10)) not in {s.tokens for s in cache._saved.values()}
    cache.add(saved([2], 101))  # larger than the whole limit: not kept
    assert len(cache) == 3


def test_the_longest_shared_start_is_loaded_where_it_beats_the_live_cache() -> None:
    cache = PromptCache(1000)
    long, short = saved(range(400)), saved(range(200))
    cache.add(saved([9] * 300))
    cache.add(short)
    cache.add(long)  # extends `short`, which goes
    prompt = [*range(300), 5, 5]
    assert cache.best(prompt, 0) == (long, 300)
    assert cache.best(prompt, 300 - MIN_GAIN_TOKENS) == (long, 300)
    assert cache.best(prompt, 300 - MIN_GAIN_TOKENS + 1) is None


def test_the_default_limit_is_an_eighth_of_memory_and_4_gib_at_most() -> None:
    assert default_limit(16 * GIB) == 2 * GIB
    assert default_limit(128 * GIB) == 4 * GIB
    assert prompt_cache_bytes(load_settings(prompt_cache="512M")) == 512 << 20
    assert prompt_cache_bytes(load_settings(prompt_cache="0")) == 0
    assert prompt_cache_bytes(load_settings(rpc="127.0.0.1:50052")) == 0  # each save would cross the network
    assert prompt_cache_bytes(load_settings()) > 0
    with pytest.raises(ConfigError, match="cannot read the size 'lots'"):
        load_settings(prompt_cache="lots")


# --- the engine --------------------------------------------------------------------

CONVERSATION = "let us write some code for the parser and the tests " * 24
OTHER = "a different question about the weather and the sea " * 24


def engine_with(target: Path, limit: int, draft: Path | None = None, load: LoadOptions = TINY) -> Engine:
    config = EngineConfig(
        target=target,
        draft=draft,
        load=load,
        ngram_memory_tokens=0,
        draft_min_confidence=0.0,
        prompt_cache_bytes=limit,
    )
    engine = Engine(config)
    engine.wait_ready()
    return engine


@pytest.fixture(scope="module")
def cached(tiny_target: Path) -> Iterator[Engine]:
    with engine_with(tiny_target, 64 << 20) as engine:
        yield engine


def ask(engine: Engine, prompt: str, cache_prompt: bool = True, method: Method = "none") -> GenerationResult:
    request = GenerationRequest(
        prompt=prompt, max_tokens=24, speculative=SpecParams(method), cache_prompt=cache_prompt
    )
    return engine.generate(request)


def test_a_conversation_another_came_between_goes_on_from_its_saved_cache(cached: Engine) -> None:
    first = ask(cached, CONVERSATION)
    assert first.stats.prompt_tokens > MIN_SAVED_TOKENS + MIN_GAIN_TOKENS
    ask(cached, OTHER)
    again = ask(cached, CONVERSATION)
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1  # the last is read for its logits
    assert again.token_ids == first.token_ids  # --exact loading: bit for bit what it was
    # The next turn goes on from the loaded cache, as from any other.
    turn = ask(cached, CONVERSATION + again.text + " and then")
    assert turn.stats.cached_tokens >= again.stats.prompt_tokens
    fresh = ask(cached, CONVERSATION + again.text + " and then", cache_prompt=False)
    assert turn.token_ids == fresh.token_ids


def test_without_a_prompt_cache_it_reads_the_conversation_again(tiny_target: Path) -> None:
    with engine_with(tiny_target, 0) as engine:
        first = ask(engine, CONVERSATION)
        ask(engine, OTHER)
        again = ask(engine, CONVERSATION)
    assert again.stats.cached_tokens < 5
    assert again.token_ids == first.token_ids


def test_a_request_without_the_cache_reads_its_prompt_whole(cached: Engine) -> None:
    ask(cached, OTHER)
    fresh = ask(cached, CONVERSATION, cache_prompt=False)
    assert fresh.stats.cached_tokens == 0


def test_dropped_caches_free_their_memory_and_the_prompt_is_read_again(tiny_target: Path) -> None:
    with engine_with(tiny_target, 64 << 20) as engine:
        ask(engine, CONVERSATION)
        ask(engine, OTHER)
        count, held = engine.info.saved_prompts, engine.info.saved_prompt_bytes
        assert count == 1 and held > 0
        assert engine.drop_saved_prompts() == held
        assert (engine.info.saved_prompts, engine.info.saved_prompt_bytes) == (0, 0)
        assert engine.drop_saved_prompts() == 0
        assert ask(engine, CONVERSATION).stats.cached_tokens < 5


def test_a_saved_cache_llama_cpp_cannot_load_is_dropped_and_the_prompt_read(
    tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine_with(tiny_target, 64 << 20) as engine:
        first = ask(engine, CONVERSATION)
        ask(engine, OTHER)
        # The real function wrote nothing back: llama.cpp refused the bytes (a full cache, say).
        monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data", lambda *args: 0)
        again = ask(engine, CONVERSATION)
        monkeypatch.undo()
        assert again.stats.cached_tokens == 0
        assert again.token_ids == first.token_ids
        assert ask(engine, CONVERSATION).stats.cached_tokens == again.stats.prompt_tokens - 1


def test_the_draft_model_goes_back_to_its_cache_of_the_conversation_too(
    tiny_target: Path, tiny_perfect_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fast loading: --exact drafts nothing past position 256, where this conversation already is.
    fast = LoadOptions(n_ctx=1024, n_threads=1)
    with engine_with(tiny_target, 64 << 20, tiny_perfect_draft, fast) as engine:
        ask(engine, CONVERSATION, method="draft")
        ask(engine, OTHER, method="draft")
        drafter = engine._model_drafter()
        assert isinstance(drafter, ModelDrafter)
        fed: list[int] = []
        decode = drafter.model.decode

        def counted(tokens: list[int], *args: object, **kwargs: object) -> float:
            fed.append(len(tokens))
            return decode(tokens, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(drafter.model, "decode", counted)
        again = ask(engine, CONVERSATION, method="draft")
    assert again.stats.accepted > 0 and again.stats.cached_tokens == again.stats.prompt_tokens - 1
    assert fed and max(fed) < 8  # the draft read none of the conversation again, only its last token


def test_long_contexts_on_the_cpu_read_without_flash_attention(tiny_target: Path) -> None:
    # Observed through the cache's layout: llama.cpp stores V transposed without flash attention,
    # and refuses a saved state whose layout is not its own.
    def load(n_ctx: int, flash_attn: bool | None = None) -> LlamaModel:
        return LlamaModel(tiny_target, LoadOptions(n_ctx=n_ctx, n_threads=1, flash_attn=flash_attn))

    models = {
        "long": load(LONG_CONTEXT),
        "long, flash attention asked for": load(LONG_CONTEXT, True),
        "short": load(LONG_CONTEXT // 2),
        "short, flash attention off": load(LONG_CONTEXT // 2, False),
    }
    try:
        assert [flash_attention(m.options, m.on_gpu) for m in models.values()] == [False, True, True, False]
        source = models["long"]
        source.decode(source.tokenize("the model is here"), 1)
        state = source.save_state()
        for name, model in models.items():
            if flash_attention(model.options, model.on_gpu):
                with pytest.raises(LocalspecError, match="could not load a saved prompt cache"):
                    model.load_state(state, source.n_past)
            else:
                model.load_state(state, source.n_past)
                assert model.n_past == source.n_past, name
    finally:
        for model in models.values():
            model.close()


def test_a_quantized_cache_without_flash_attention_is_one_clear_error(tiny_target: Path) -> None:
    options = LoadOptions(n_ctx=512, n_threads=1, kv_type="q8_0", flash_attn=False)
    with pytest.raises(UnsupportedModelError, match="q8_0 KV cache needs flash attention"):
        LlamaModel(tiny_target, options)
