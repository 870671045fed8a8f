"""Repetition penalties (repeat, frequency, presence over the last n tokens), as llama.cpp applies them.

Checked against llama.cpp's own penalties sampler, through the engine for every method (a
penalised reply is the target alone's, whatever drafted it), and through the API's bodies.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import llama_cpp
import numpy as np
import pytest
from test_engine import PROMPTS, decode_alone, run

from localspec.engine.llama import LlamaModel
from localspec.engine.sampling import adjusted, distribution, sample_at
from localspec.engine.worker import Engine
from localspec.errors import UserInputError
from localspec.server.schemas import ChatCompletionBody, OllamaChatBody, chat_request, parse_body
from localspec.server.schemas_llamaserver import LlamaServerBody, NativeCompletionBody, completion_request
from localspec.types import SamplingParams, SpecParams

# Strong enough to move a tiny model's greedy choices; one set per penalty, and all three at once.
PENALTIES = [
    SamplingParams(repeat_penalty=1.8),
    SamplingParams(frequency_penalty=1.5, repeat_last_n=16),
    SamplingParams(presence_penalty=2.0, repeat_last_n=-1),
    SamplingParams(repeat_penalty=0.7, frequency_penalty=-0.5, presence_penalty=0.8, repeat_last_n=8),
]


def llama_cpp_penalized(logits: np.ndarray, sequence: Sequence[int], params: SamplingParams) -> np.ndarray:
    """`logits` through llama.cpp's penalties sampler after it accepted `sequence`."""
    n = logits.shape[0]
    # llama.cpp's callers turn -1 into the context size; the sampler itself reads it as off.
    last_n = params.repeat_last_n if params.repeat_last_n >= 0 else max(len(sequence), 1)
    sampler = llama_cpp.llama_sampler_init_penalties(
        n, last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty
    )
    try:
        for token in sequence:
            llama_cpp.llama_sampler_accept(sampler, token)
        data = (llama_cpp.llama_token_data * n)()
        for i in range(n):
            data[i].id, data[i].logit, data[i].p = i, float(logits[i]), 0.0
        array = llama_cpp.llama_token_data_array(data, n, -1, False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return np.array([data[i].logit for i in range(n)], dtype=np.float32)
    finally:
        llama_cpp.llama_sampler_free(sampler)


@pytest.mark.parametrize("params", PENALTIES)
def test_the_penalties_are_llama_cpps(params: SamplingParams) -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(2000) * 4).astype(np.float32)
    sequence = [int(t) for t in rng.integers(0, 60, size=90)]  # repeats within and past the window
    for before, ahead in ((sequence, []), (sequence[:80], sequence[80:]), ([], sequence[:5])):
        got = adjusted(logits, params, before, ahead)
        want = llama_cpp_penalized(logits, [*before, *ahead], params)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert not np.array_equal(got, logits)
    np.testing.assert_array_equal(
        logits, (np.random.default_rng(0).standard_normal(2000) * 4).astype(np.float32)
    )


def test_no_penalty_leaves_the_logits_as_they_are() -> None:
    logits = np.arange(10, dtype=np.float32)
    for params in (SamplingParams(), SamplingParams(repeat_penalty=2.0, repeat_last_n=0)):
        assert adjusted(logits, params, [1, 1, 2]) is logits
    # A token past the vocabulary (a draft model's may be shorter than the target's) is left out.
    out = adjusted(logits, SamplingParams(presence_penalty=1.0), [3, 12])
    assert out[3] == 2.0 and np.delete(out, 3).tolist() == np.delete(logits, 3).tolist()


def test_a_penalty_past_float32s_range_leaves_every_logit_finite() -> None:
    # Found by the API fuzzer: repeat_penalty 1e-300 is 0 in float32, and a logit divided by it
    # infinite; the sampled distribution was then empty.
    logits = np.array([3.0, -1.0, 2.0, 0.5], dtype=np.float32)
    params = SamplingParams(temperature=2.0, repeat_penalty=1e-300, frequency_penalty=2.0)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out = adjusted(logits, params, [0, 1])
        assert np.isfinite(out).all() and int(out.argmax()) == 0
        assert sample_at(distribution(out, params), 0.99) == 0


def _alone(model: LlamaModel, prompt: str, params: SamplingParams, n: int) -> list[int]:
    """Greedy decoding one token at a time, each choice made over llama.cpp's own penalties."""
    start = len(model.tokenize(prompt))

    def choose(logits: np.ndarray, sequence: list[int]) -> int | None:
        token = int(llama_cpp_penalized(logits, sequence, params).argmax())
        return None if model.is_eog(token) or len(sequence) - start >= n else token

    return decode_alone(model, prompt, choose)


@pytest.mark.parametrize("params", PENALTIES)
def test_a_penalised_greedy_reply_is_the_target_alones_for_every_method(
    perfect: Engine, tiny: LlamaModel, params: SamplingParams
) -> None:
    changed = 0
    for prompt in PROMPTS[:5]:
        plain = run(perfect, prompt, "none", max_tokens=24).token_ids
        base = run(perfect, prompt, "none", max_tokens=24, sampling=params)
        assert list(base.token_ids) == _alone(tiny, prompt, params, 24), prompt
        changed += base.token_ids != plain
        for method in ("draft", "ngram", "layerskip", "auto"):
            spec = run(perfect, prompt, method, 4, max_tokens=24, sampling=params)
            assert spec.token_ids == base.token_ids, (prompt, method)
            assert spec.stats.fallback_reason is None
    assert changed  # the penalties bite


def test_penalised_drafts_are_still_accepted(perfect: Engine) -> None:
    # The draft model is penalised as the target is: the target's own weights drafting are always right.
    params = SamplingParams(repeat_penalty=1.8, frequency_penalty=0.5)
    stats = run(perfect, PROMPTS[2], "draft", 4, max_tokens=48, sampling=params).stats
    assert stats.drafted > 0 and stats.accepted == stats.drafted


def test_a_penalised_sampled_reply_is_the_same_draw_for_every_method(perfect: Engine) -> None:
    params = SamplingParams(temperature=0.9, seed=11, repeat_penalty=1.5, presence_penalty=0.5)
    base = run(perfect, PROMPTS[0], "none", max_tokens=32, sampling=params).token_ids
    for method in ("draft", "ngram", "auto"):
        assert run(perfect, PROMPTS[0], method, 4, max_tokens=32, sampling=params).token_ids == base


def test_the_bodies_carry_the_penalties_by_their_clients_names() -> None:
    chat = parse_body(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
        b' "frequency_penalty": 0.5, "presence_penalty": -0.25, "repeat_penalty": 1.1}',
        ChatCompletionBody,
    ).sampling()
    assert (chat.frequency_penalty, chat.presence_penalty, chat.repeat_penalty) == (0.5, -0.25, 1.1)
    assert chat.repeat_last_n == 64
    ollama = parse_body(
        b'{"model": "m", "options": {"repeat_penalty": 1.2, "repeat_last_n": -1}}', OllamaChatBody
    ).options.sampling()
    assert (ollama.repeat_penalty, ollama.repeat_last_n, ollama.penalized) == (1.2, -1, True)
    assert not parse_body(b'{"model": "m"}', OllamaChatBody).options.sampling().penalized
    server = LlamaServerBody.model_validate({"repeat_penalty": 1.3, "samplers": ["top_k", "temperature"]})
    assert not server.sampling().penalized  # a chain without "penalties" applies none
    assert LlamaServerBody.model_validate({"repeat_penalty": 1.3}).sampling().penalized
    for bad in (b'"repeat_penalty": 0', b'"frequency_penalty": 3', b'"repeat_last_n": -2'):
        with pytest.raises(UserInputError):
            parse_body(
                b'{"model": "m", "messages": [{"role": "user", "content": "x"}], ' + bad + b"}",
                ChatCompletionBody,
            )


# Logit bias: added to the logits before the penalties, as llama.cpp's chain does.


def test_a_banned_first_choice_gives_the_second_for_every_method(perfect: Engine) -> None:
    prompt = PROMPTS[1]
    ranked = run(perfect, prompt, "none", max_tokens=1, logprobs=2).logprobs[0].top
    first, second = ranked[0].token, ranked[1].token
    banned = SamplingParams(logit_bias=((first, -math.inf),))
    base = run(perfect, prompt, "none", max_tokens=16, sampling=banned)
    assert base.token_ids[0] == second and first not in base.token_ids
    for method in ("draft", "ngram", "layerskip", "auto"):
        assert run(perfect, prompt, method, 4, max_tokens=16, sampling=banned).token_ids == base.token_ids
    pushed = SamplingParams(logit_bias=((second, 100.0),))
    assert set(run(perfect, prompt, "draft", 4, max_tokens=8, sampling=pushed).token_ids) == {second}


def test_a_bias_outside_the_vocabulary_is_refused(perfect: Engine) -> None:
    with pytest.raises(UserInputError, match="outside this model's"):
        run(perfect, "x", "none", max_tokens=2, sampling=SamplingParams(logit_bias=((10**7, 1.0),)))


def test_the_bodies_carry_the_logit_bias() -> None:
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": -100, "7": 2.5}}'
    )
    assert parse_body(body, ChatCompletionBody).sampling().logit_bias == ((5, -100.0), (7, 2.5))
    server = LlamaServerBody.model_validate({"logit_bias": [[5, False], [9, 1]]}).sampling()
    assert server.logit_bias == ((5, -math.inf), (9, 1.0))
    for bad in (b'{"x": 1}', b'{"5": 101}', b'{"5": true}', b'{"5": Infinity}', b'{"5": NaN}'):
        with pytest.raises(UserInputError) as caught:
            raw = (
                b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": ' + bad + b"}"
            )
            parse_body(raw, ChatCompletionBody).sampling()
        assert caught.value.param == "logit_bias"


def test_ignore_eos_goes_on_past_the_end_for_every_method(perfect: Engine) -> None:
    """llama-server's and vLLM's ignore_eos: every end-of-generation token banned, so the reply runs
    to max_tokens; up to where it ended it is the reply as it was, and every method writes it."""
    prompt = "for i in range(10):"  # the tiny target ends this one after 43 tokens
    ended = run(perfect, prompt, "none", max_tokens=64)
    past = run(perfect, prompt, "none", max_tokens=64, ignore_eos=True)
    assert ended.finish_reason == "stop" and len(ended.token_ids) < 64
    assert past.finish_reason == "length" and len(past.token_ids) == 64
    assert past.token_ids[: len(ended.token_ids)] == ended.token_ids
    for method in ("draft", "ngram", "layerskip", "auto"):
        assert run(perfect, prompt, method, 4, max_tokens=64, ignore_eos=True).token_ids == past.token_ids
    with pytest.raises(UserInputError, match="ignore_eos cannot go with a JSON schema"):
        run(perfect, prompt, "none", max_tokens=4, ignore_eos=True, json_schema={"type": "object"})


def test_the_bodies_carry_ignore_eos() -> None:
    chat = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "ignore_eos": true}'
    assert chat_request(parse_body(chat, ChatCompletionBody), SpecParams(), 100).ignore_eos
    server = NativeCompletionBody.model_validate({"prompt": "x", "ignore_eos": True})
    assert completion_request(server, SpecParams(), 100).ignore_eos
