"""Long inputs read by a plain copy of the weights, its cache taken over by the repacked model.

On the tiny target: the taken-over cache gives the logits the model alone gives (up to float
rounding), through later one-token steps, truncation, a second long input after tokens the
model decoded itself, and a cancelled read; whether the copy is attached follows the setting,
or the measurement, which is cached. The Qwen target (slow) shows the same on a real model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from cancelpoints import SetWhen

from localspec.engine import llama, prefill
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.llama import PREFILL_MIN, LlamaModel, ReadPaused
from localspec.engine.prefill import attach_plain_prefill
from localspec.engine.worker import Engine
from localspec.errors import RequestCancelledError
from localspec.pickdraft.memplan import ModelShape
from localspec.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.timeout(180)

OPTIONS = LoadOptions(n_ctx=1024, n_threads=1, n_batch=64)
ATOL = 1e-3  # the tiny model's logits are small; rounding differences are far below this


def tokens(model: LlamaModel, n: int) -> list[int]:
    text = model.tokenize("the quick brown fox jumps over the lazy dog and " * 40, add_special=False)
    return text[:n]


def with_prefill(path: Path) -> LlamaModel:
    model = LlamaModel(path, replace(OPTIONS, plain_prefill=True))
    line = attach_plain_prefill(model, Path("/nonexistent"))  # set: nothing measured, nothing cached
    assert line == "prompts read with plain weights (as set)" and model.plain_prefill
    return model


def cached_positions(model: LlamaModel) -> int:
    return int(llama_cpp.llama_memory_seq_pos_max(model._memory, 0)) + 1


def decode_both(alone: LlamaModel, split: LlamaModel, step: list[int]) -> None:
    """`step` into the model alone and the one with the copy: the same positions, cached, and logits."""
    for model in (alone, split):
        model.decode(step, 2)
    assert split.n_past == alone.n_past == cached_positions(split)
    for i in (-2, -1):
        np.testing.assert_allclose(split.logits(i), alone.logits(i), atol=ATOL)


def test_a_long_prompt_read_by_the_plain_copy_continues_as_the_model_alone(tiny_target: Path) -> None:
    alone, split = LlamaModel(tiny_target, OPTIONS), with_prefill(tiny_target)
    try:
        prompt = tokens(alone, 200)
        for model in (alone, split):
            model.decode(prompt, 1)
        assert split.n_past == cached_positions(split) == 200
        np.testing.assert_allclose(split.logits(-1), alone.logits(-1), atol=ATOL)
        for _ in range(8):  # one-token steps run on the repacked model itself, over the taken cache
            nxt = int(np.argmax(alone.logits(-1)))
            for model in (alone, split):
                model.decode([nxt], 1)
            np.testing.assert_allclose(split.logits(-1), alone.logits(-1), atol=ATOL)
        # A second long input after tokens the model decoded itself, then after a truncation.
        for keep in (None, 150):
            if keep is not None:
                for model in (alone, split):
                    model.truncate(keep)
            decode_both(alone, split, tokens(alone, 64 + 3)[3:])
    finally:
        alone.close()
        split.close()


Models = tuple[LlamaModel, LlamaModel, LlamaModel]


@pytest.fixture
def small_copy(tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Models]:
    """The model alone, and one with a plain copy whose context starts at 256 of its 1,024 tokens,
    and that copy."""
    monkeypatch.setattr(prefill, "PLAIN_CONTEXT", 256)
    alone, split = LlamaModel(tiny_target, OPTIONS), with_prefill(tiny_target)
    plain = split._prefill
    try:
        assert plain is not None and plain.n_ctx == 256 and split.n_ctx == 1024
        yield alone, split, plain
    finally:
        alone.close()
        split.close()


def test_the_copy_s_context_starts_small_and_grows_to_what_a_read_needs(small_copy: Models) -> None:
    # Its cache is a second one beside the model's: sized for most prompts, grown (doubling, up
    # to the model's) where a read needs more, with what the model holds handed over again.
    alone, split, plain = small_copy
    steps = [tokens(alone, 200), [], tokens(alone, 300), tokens(alone, 120), tokens(alone, 390)]
    sizes, grown = [], []
    for step in steps:
        if not step:  # one-token steps on the repacked model itself: the copy lacks them
            for _ in range(4):
                nxt = int(np.argmax(alone.logits(-1)))
                for model in (alone, split):
                    model.decode([nxt], 1)
            continue
        decode_both(alone, split, step)
        sizes.append(plain.n_ctx)
        grown.append(split.prefill_grown_bytes)
    assert sizes == [256, 512, 1024, 1024]  # 204 fit; 504 past 256; 624 past 512; 1014
    assert split._out_ctx == plain._ctx  # the last read's logits: the grown copy's
    # What it grew by past the plan's count (the copy as attached), for the daemon's memory count.
    assert grown == [0, *(plain.context_bytes(n) - plain.context_bytes(256) for n in (512, 1024, 1024))]
    assert 0 < grown[1] < grown[2]


def test_a_copy_grows_only_where_the_machine_has_room_and_asks_again_at_each_longer_read(
    small_copy: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan counts the copy as it loads; a growth must not take the memory the models need.
    alone, split, plain = small_copy
    asked: list[int] = []
    room = [False]

    def room_for(size: int) -> bool:  # the machine's free memory: the one thing a test cannot set
        asked.append(size)
        return room[0]

    monkeypatch.setattr(llama, "room_for", room_for)
    for step in (tokens(alone, 200), tokens(alone, 300), tokens(alone, 120)):
        decode_both(alone, split, step)
    # 504 past 256 wanted 512 (the whole new context: made while the old one is still there); 624
    # asked again, not remembered as refused: memory frees up.
    assert asked == [plain.context_bytes(512), plain.context_bytes(624)]
    assert split._out_ctx == split._ctx and plain.n_ctx == 256 and split.prefill_grown_bytes == 0
    room[0] = True
    decode_both(alone, split, tokens(alone, 300))  # 924 past 256 grows to 1,024 now
    assert plain.n_ctx == 1024 and split._out_ctx == plain._ctx and asked[-1] == plain.context_bytes(1024)


@pytest.mark.parametrize("flash", [True, False])
def test_a_context_s_bytes_are_the_memory_plan_s(tiny_target: Path, flash: bool) -> None:
    # The engine sizes a growth from llama.cpp's model, the plan from the file's header: one count.
    shape = ModelShape.from_file(tiny_target, None)
    model = LlamaModel(tiny_target, LoadOptions(n_ctx=512, n_threads=1, flash_attn=flash))
    try:
        for n_ctx in (256, 1000, 4096):
            scores = 0 if flash else shape.plain_attention_resident(n_ctx) - shape.plain_attention_resident(0)
            kv = shape.n_layers * shape.kv_bytes_per_layer(n_ctx, "f16")
            assert model.context_bytes(n_ctx) == kv + scores
    finally:
        model.close()


def test_a_copy_llama_cpp_cannot_grow_leaves_longer_reads_to_the_model_and_is_asked_once(
    small_copy: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone, split, plain = small_copy
    asked: list[int] = []

    def refuse(n_ctx: int) -> bool:  # as llama_init_from_model returning NULL (no memory)
        asked.append(n_ctx)
        return False

    monkeypatch.setattr(plain, "resize_context", refuse)
    for step in (tokens(alone, 200), tokens(alone, 300), tokens(alone, 120)):
        decode_both(alone, split, step)
    assert asked == [512]  # 504 past 256 asked for 512, refused; 624 not asked again
    assert split._out_ctx == split._ctx and plain.n_ctx == 256  # the model read them itself


def test_a_context_llama_cpp_cannot_make_leaves_the_old_one(
    small_copy: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone, split, plain = small_copy
    decode_both(alone, split, tokens(alone, 200))
    monkeypatch.setattr(llama_cpp, "llama_init_from_model", lambda model, params: None)  # no memory
    assert not plain.resize_context(512)
    assert plain.n_ctx == plain.options.n_ctx == 256 and plain.n_past == 200  # kept, cache and all
    monkeypatch.undo()
    decode_both(alone, split, tokens(alone, 40))  # fits: the copy reads on from what it holds
    assert split._out_ctx == plain._ctx


def test_the_copy_has_the_model_s_attention_whatever_its_own_size(tiny_target: Path) -> None:
    # A cache goes over only between contexts of one layout (V is transposed without flash attention).
    for n_ctx, flash in ((16384, False), (1024, True)):
        model = LlamaModel(tiny_target, replace(OPTIONS, n_ctx=n_ctx, plain_prefill=True))
        try:
            attach_plain_prefill(model, Path("/nonexistent"))
            assert model._prefill is not None and model._prefill.options.flash_attn is flash
            assert model._prefill.n_ctx == min(n_ctx, prefill.PLAIN_CONTEXT)
            model.decode(tokens(model, 100), 1)  # handed over: it would fail across layouts
            assert model.n_past == cached_positions(model) == 100
        finally:
            model.close()


def test_short_inputs_stay_on_the_model_and_a_cancelled_read_keeps_its_chunks(tiny_target: Path) -> None:
    split = with_prefill(tiny_target)
    try:
        prompt = tokens(split, 300)
        split.decode(prompt[: PREFILL_MIN - 1], 1)  # too short to hand over
        assert split._out_ctx == split._ctx
        plain = split._prefill
        assert plain is not None
        cancel = SetWhen(lambda: plain.n_past >= PREFILL_MIN - 1 + 2 * OPTIONS.n_batch)
        with pytest.raises(RequestCancelledError):
            split.decode(prompt[PREFILL_MIN - 1 :], 1, cancel)
        # The chunks read before the cancel are cached in the model, as decode() promises.
        assert split.n_past == cached_positions(split) == PREFILL_MIN - 1 + 2 * OPTIONS.n_batch
    finally:
        split.close()


@pytest.mark.parametrize("copy", [False, True], ids=["model", "plain copy"])
def test_a_read_paused_between_chunks_goes_on_after_another_input_as_if_it_had_not(
    tiny_target: Path, copy: bool
) -> None:
    """A short request runs in a long prompt's read (engine.interleave): the read stops between two
    chunks with the model holding them, the model serves another input (read by the plain copy too,
    which holds the paused read's positions no more), the saved cache goes back, and the read goes
    on to the logits the model alone gives."""
    alone = LlamaModel(tiny_target, OPTIONS)
    model = with_prefill(tiny_target) if copy else LlamaModel(tiny_target, OPTIONS)
    try:
        prompt = tokens(alone, 300)
        alone.decode(prompt, 1)
        asked: list[tuple[int, int]] = []

        def between(done: int) -> bool:  # asked between chunks only: never before the first
            reader = model._prefill if copy and model._prefill is not None else model
            asked.append((done, reader.n_past))
            return len(asked) == 2

        with pytest.raises(ReadPaused) as stopped:
            model.decode(prompt, 1, between=between)
        chunk = OPTIONS.n_batch
        assert asked == [(chunk, chunk), (2 * chunk, 2 * chunk)] and stopped.value.seconds > 0
        assert model.n_past == cached_positions(model) == 2 * OPTIONS.n_batch  # held by the model
        n_past, state = model.n_past, model.save_state()
        model.reset()
        # Another request's input, longer than the paused read's: the copy reads it, and holds more
        # positions than the saved cache, none of them its.
        model.decode(prompt[::-1][:200], 1)
        model.load_state(state, n_past)
        model.decode(prompt[n_past:], 1, between=lambda _done: False)
        assert model.n_past == cached_positions(model) == len(prompt)
        np.testing.assert_allclose(model.logits(-1), alone.logits(-1), atol=ATOL)
    finally:
        alone.close()
        model.close()


def test_an_input_short_against_the_cache_stays_on_the_model(tiny_target: Path) -> None:
    model = LlamaModel(tiny_target, replace(OPTIONS, n_ctx=4096, plain_prefill=True))
    attach_plain_prefill(model, Path("/nonexistent"))
    try:
        text = tokens(model, 400)
        model.decode((text * 6)[:2100], 1)  # read by the plain copy: nothing cached yet
        assert model._out_ctx != model._ctx
        model.decode(text[:PREFILL_MIN], 1)  # copying 2,100 cached positions twice costs more
        assert model._out_ctx == model._ctx
        model.decode(text[: PREFILL_MIN + 40], 1)  # long enough against the cache: handed over
        assert (
            model._out_ctx != model._ctx
            and model.n_past == cached_positions(model) == 2100 + 2 * PREFILL_MIN + 40
        )
    finally:
        model.close()


def test_the_choice_is_measured_once_and_cached(tiny_target: Path, tmp_path: Path) -> None:
    model = LlamaModel(tiny_target, OPTIONS)
    try:
        measuring: list[float] = []
        first = attach_plain_prefill(model, tmp_path, measuring.append)
        assert first is not None and first.endswith("(measured on 192 tokens)")
        assert measuring == [0.0, 0.25, 0.5, 0.75, 1.0]  # from its start, one report per read
        assert model.plain_prefill == first.startswith("prompts read with plain weights")
        again = LlamaModel(tiny_target, OPTIONS)
        try:
            cached: list[float] = []
            second = attach_plain_prefill(again, tmp_path, cached.append)
            assert second is not None and second.endswith("(cached)") and not cached
            assert again.plain_prefill == model.plain_prefill
        finally:
            again.close()
    finally:
        model.close()


def test_never_with_exact_loading_or_when_switched_off(tiny_target: Path, tmp_path: Path) -> None:
    for options in (replace(OPTIONS, batch_invariant=True), replace(OPTIONS, plain_prefill=False)):
        model = LlamaModel(tiny_target, options)
        try:
            assert attach_plain_prefill(model, tmp_path) is None and not model.plain_prefill
        finally:
            model.close()
    assert not list(tmp_path.iterdir())  # nothing was measured


def test_the_engine_reports_the_measurement_as_it_loads(tiny_target: Path, tmp_path: Path) -> None:
    reports: list[tuple[str, float]] = []
    config = EngineConfig(target=tiny_target, load=OPTIONS, method="none", cache_dir=tmp_path)
    with Engine(config, progress=lambda what, fraction: reports.append((what, fraction))) as engine:
        engine.wait_ready()
    checks = [fraction for what, fraction in reports if what == "prompt-read check"]
    assert checks[0] == 0.0 and checks[-1] == 1.0
    assert reports.index(("prompt-read check", 0.0)) > reports.index(("target", 1.0))


def test_the_engine_reads_prompts_with_the_plain_copy_and_says_so(tiny_target: Path) -> None:
    texts = []
    for setting in (True, False):
        config = EngineConfig(target=tiny_target, load=replace(OPTIONS, plain_prefill=setting), method="none")
        with Engine(config) as engine:
            engine.wait_ready()
            assert engine.info.plain_prefill is setting
            request = GenerationRequest(
                prompt="the quick brown fox jumps over the lazy dog " * 20,
                max_tokens=16,
                sampling=SamplingParams(),
            )
            texts.append(engine.generate(request).text)
    assert texts[0] == texts[1]


@pytest.mark.slow
def test_on_the_qwen_target_the_handed_over_cache_matches_within_rounding(qwen_target: Path) -> None:
    path = qwen_target
    options = LoadOptions(n_ctx=1024)
    alone, split = LlamaModel(path, options), LlamaModel(path, replace(options, plain_prefill=True))
    try:
        attach_plain_prefill(split, Path("/nonexistent"))
        prompt = tokens(alone, 300)
        for model in (alone, split):
            model.decode(prompt, 1)
        # Batched kernels round differently (docs/benchmarks.md: 0.574 logits at most on verifies).
        assert np.abs(split.logits(-1) - alone.logits(-1)).max() < 1.0
        assert int(np.argmax(split.logits(-1))) == int(np.argmax(alone.logits(-1)))
    finally:
        alone.close()
        split.close()


@pytest.mark.parametrize("copy", [False, True], ids=["model", "plain copy"])
def test_meanwhile_runs_once_with_the_last_chunk_not_counted_as_llamas(tiny_target: Path, copy: bool) -> None:
    # The engine prepares a request's lookups while the prompt is read: after the last chunk is
    # handed to llama.cpp (on a GPU, as it computes) and before it is waited for.
    model = with_prefill(tiny_target) if copy else LlamaModel(tiny_target, OPTIONS)
    alone = LlamaModel(tiny_target, OPTIONS)
    reader = model._prefill if copy else model
    assert reader is not None
    seen: list[int] = []

    def meanwhile() -> None:
        seen.append(reader.n_past)  # counted after each chunk is waited for
        time.sleep(0.2)

    try:
        prompt = tokens(model, 200)  # chunks of 64: the last one from 192
        started = time.perf_counter()
        spent = model.decode(prompt, 1, meanwhile=meanwhile)
        wall = time.perf_counter() - started
        assert seen == [192]
        assert 0 < spent <= wall - 0.2
        assert model.n_past == 200
        alone.decode(prompt, 1)
        np.testing.assert_allclose(model.logits(-1), alone.logits(-1), atol=ATOL)
    finally:
        model.close()
        alone.close()
