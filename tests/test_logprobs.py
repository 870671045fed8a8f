"""Token log-probabilities: the target's own, whichever method decoded the reply.

Checked against a float64 log-softmax of the target alone's logits, one token at a time, for every
method; streamed with each chunk's tokens; and through the API with the real `openai` and `ollama`
packages and llama-server's `n_probs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from daemonproc import Daemon, start_daemon
from test_engine import PROMPTS, decode_alone, run

from localspec.engine.llama import LlamaModel
from localspec.engine.sampling import token_logprob
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, GenerationResult, SamplingParams, SpecParams

pytestmark = pytest.mark.timeout(120)


def _log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_a_token_logprob_is_the_log_softmax_with_the_most_probable_beside_it() -> None:
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    logits[[10, 20]] = logits.max() + 1  # a tie for the top: by id
    lp = token_logprob(logits, 42, 4, lambda t: f"t{t}".encode())
    want = _log_softmax(logits)
    assert (lp.token, lp.text, lp.piece) == (42, "t42", b"t42")
    assert lp.logprob == pytest.approx(want[42], abs=1e-5)
    assert [t.token for t in lp.top] == [10, 20, *np.argsort(-want)[2:4].tolist()]
    assert [t.logprob for t in lp.top] == pytest.approx(np.sort(want)[::-1][:4].tolist(), abs=1e-5)
    # A special token renders as nothing: its name stands for it (LlamaModel.shown_piece).
    assert token_logprob(logits, 1, 0, lambda t: b"<|end|>").text == "<|end|>"
    assert token_logprob(logits, 1, 0, lambda t: b"x").top == ()


def _alone(model: LlamaModel, prompt: str, tokens: tuple[int, ...]) -> list[float]:
    """The target alone's float64 log-probability of each token, decoded one at a time."""
    out: list[float] = []

    def follow(logits: np.ndarray, _sequence: list[int]) -> int | None:
        if len(out) == len(tokens):
            return None
        out.append(float(_log_softmax(logits)[tokens[len(out)]]))
        return tokens[len(out) - 1]

    decode_alone(model, prompt, follow)
    return out


@pytest.mark.parametrize("method", ["none", "draft", "ngram", "layerskip", "auto"])
def test_each_tokens_logprob_is_the_target_alones_for_every_method(
    perfect: Engine, tiny: LlamaModel, method: str
) -> None:
    drafted = 0
    for prompt in PROMPTS[:4]:
        result = run(perfect, prompt, method, 4, max_tokens=24, logprobs=3)  # type: ignore[arg-type]
        assert [lp.token for lp in result.logprobs] == list(result.token_ids)
        alone = _alone(tiny, prompt, result.token_ids)
        # Up to the batched kernels' rounding (a verify's rows are not one-token decodes').
        assert [lp.logprob for lp in result.logprobs] == pytest.approx(alone, abs=2e-3)
        for lp in result.logprobs:
            assert len(lp.top) == 3 and lp.top[0].token == lp.token  # greedy: the most probable
        drafted += result.stats.drafted
    if method in ("draft", "layerskip"):
        assert drafted > 0  # decided in batched verifies


def test_streamed_chunks_carry_their_tokens_logprobs(perfect: Engine) -> None:
    request = GenerationRequest(
        prompt=PROMPTS[2], max_tokens=32, speculative=SpecParams("draft", 4), logprobs=1
    )
    handle = perfect.submit(request)
    chunks = list(handle)
    assert handle.result is not None
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    assert tuple(lp for c in chunks for lp in c.logprobs) == handle.result.logprobs
    assert run(perfect, PROMPTS[2], "draft", max_tokens=8).logprobs == ()  # not asked: none


def test_a_sampled_tokens_logprob_is_of_the_token_drawn(perfect: Engine) -> None:
    params = SamplingParams(temperature=1.0, seed=5)
    result = run(perfect, PROMPTS[0], "draft", 4, max_tokens=24, sampling=params, logprobs=0)
    assert [lp.token for lp in result.logprobs] == list(result.token_ids)
    assert all(lp.logprob is not None and lp.logprob <= 0.0 and lp.top == () for lp in result.logprobs)


# Through the API.


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_perfect_draft: Path
) -> Iterator[Daemon]:
    d = start_daemon(
        tmp_path_factory.mktemp("logprobs-home"), tiny_target, "--draft", str(tiny_perfect_draft)
    )
    yield d
    assert d.stop() == 0, d.log()


def test_openai_chat_logprobs_whole_and_streamed(daemon: Daemon) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "one two"}]
    with daemon.openai() as client:
        asked: dict[str, Any] = {"max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 2}
        whole = client.chat.completions.create(model="tiny-target", messages=messages, **asked)
        choice = whole.choices[0]
        assert choice.logprobs is not None and choice.logprobs.content is not None
        content = choice.logprobs.content
        assert whole.usage is not None and len(content) == whole.usage.completion_tokens
        assert "".join(e.token for e in content) == choice.message.content
        for e in content:
            assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
            assert e.logprob <= 0 and bytes(e.bytes or []).decode() == e.token
        stream = client.chat.completions.create(model="tiny-target", messages=messages, stream=True, **asked)
        streamed = [
            e for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content or []
        ]
        # The same tokens; their values up to rounding (each request's steps batch their own way).
        assert [e.token for e in streamed] == [e.token for e in content]
        assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-2)
        plain = client.chat.completions.create(model="tiny-target", messages=messages, max_tokens=4)
        assert plain.choices[0].logprobs is None
        with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
            client.chat.completions.create(
                model="tiny-target", messages=messages, max_tokens=4, top_logprobs=2
            )


def test_openai_completions_logprobs_lists(daemon: Daemon) -> None:
    with daemon.openai() as client:
        out = client.completions.create(
            model="tiny-target", prompt="one two three", max_tokens=10, temperature=0, logprobs=2
        )
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(
        len(top) <= 2 and max(top.values()) >= p - 1e-6
        for top, p in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )


def test_ollama_logprobs(daemon: Daemon) -> None:
    with daemon.ollama() as client:
        out = client.generate(
            model="tiny-target",
            prompt="one two",
            raw=True,
            options={"temperature": 0, "num_predict": 10},
            logprobs=True,
            top_logprobs=3,
        )
        assert out.logprobs is not None and "".join(e.token for e in out.logprobs) == out.response
        assert all(e.top_logprobs is not None and len(e.top_logprobs) == 3 for e in out.logprobs)
        chunks = client.chat(
            model="tiny-target",
            messages=[{"role": "user", "content": "one two"}],
            stream=True,
            options={"temperature": 0, "num_predict": 10},
            logprobs=True,
        )
        entries = [e for c in chunks for e in c.logprobs or []]
        assert entries and all(e.logprob <= 0 for e in entries)
        assert client.generate(model="tiny-target", prompt="x", options={"num_predict": 2}).logprobs is None


def test_llama_server_n_probs(daemon: Daemon) -> None:
    with daemon.http() as http:
        body = http.post(
            "/completion", json={"prompt": "one two", "n_predict": 8, "n_probs": 2, "temperature": 0}
        ).json()
        probs = body["completion_probabilities"]
        assert len(probs) == body["tokens_predicted"] and all(len(p["top_logprobs"]) == 2 for p in probs)
        assert probs[0]["top_logprobs"][0]["id"] == probs[0]["id"]
        refused = http.post("/completion", json={"prompt": "x", "n_probs": 2, "post_sampling_probs": True})
        assert refused.status_code == 400 and "post_sampling_probs" in refused.text


def test_logit_bias_bans_the_first_choice_through_the_openai_client(daemon: Daemon) -> None:
    # The ids of the two most probable first tokens, from llama-server's n_probs.
    with daemon.http() as http:
        plain = {"prompt": "one two", "n_predict": 1, "n_probs": 2, "temperature": 0}
        top = http.post("/completion", json=plain).json()["completion_probabilities"][0]["top_logprobs"]
    with daemon.openai() as client:
        out = client.completions.create(
            model="tiny-target",
            prompt="one two",
            max_tokens=3,
            temperature=0,
            logprobs=0,
            logit_bias={str(top[0]["id"]): -100},
        )
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.tokens[0] == top[1]["token"]


def test_responses_logprobs_where_include_asks(daemon: Daemon) -> None:
    include: list[openai.types.responses.ResponseIncludable] = ["message.output_text.logprobs"]
    with daemon.openai() as client:
        asked: dict[str, Any] = {
            "max_output_tokens": 10,
            "temperature": 0,
            "include": include,
            "top_logprobs": 2,
        }
        whole = client.responses.create(model="tiny-target", input="one two", **asked)
        part = _output_text(whole)
        assert part.logprobs and "".join(e.token for e in part.logprobs) == part.text
        assert all(len(e.top_logprobs) == 2 for e in part.logprobs)
        stream = client.responses.create(model="tiny-target", input="one two", stream=True, **asked)
        deltas = [e for event in stream if event.type == "response.output_text.delta" for e in event.logprobs]
        assert [e.token for e in deltas] == [e.token for e in part.logprobs]
        plain = client.responses.create(model="tiny-target", input="one two", max_output_tokens=4)
        assert _output_text(plain).logprobs == []


def _output_text(response: openai.types.responses.Response) -> openai.types.responses.ResponseOutputText:
    message = response.output[0]
    assert message.type == "message"
    part = message.content[0]
    assert part.type == "output_text"
    return part


# The prompt scored (OpenAI completions' echo): lm-evaluation-harness's loglikelihood.

LONG = " ".join(PROMPTS) + " " + " ".join(reversed(PROMPTS))  # more than one SCORE_CHUNK of tokens


def _prompt_alone(model: LlamaModel, tokens: list[int], argmax: list[int] | None = None) -> list[float]:
    """The target alone's float64 log-probability of each prompt token after the ones before it,
    decoded one at a time (and into `argmax`, its most probable token there)."""
    model.reset()
    out: list[float] = []
    for i, token in enumerate(tokens):
        if i:
            row = _log_softmax(model.logits(-1))
            out.append(float(row[token]))
            if argmax is not None:
                argmax.append(int(row.argmax()))
        model.decode([token], 1)
    return out


def test_a_scored_prompt_is_the_target_alones_across_chunks_and_a_cached_prefix(
    perfect: Engine, tiny: LlamaModel
) -> None:
    from localspec.engine.speculative import SCORE_CHUNK

    tokens = tiny.tokenize(LONG)
    assert len(tokens) > 2 * SCORE_CHUNK
    alone = _prompt_alone(tiny, tokens)
    plain = run(perfect, LONG, "draft", max_tokens=12)
    # cache_prompt on and the same prompt just read: a scored prompt is still read whole.
    scored = run(perfect, LONG, "draft", max_tokens=12, logprobs=2, prompt_logprobs=2, cache_prompt=True)
    entries = scored.prompt_logprobs
    assert [e.token for e in entries] == tokens and scored.stats.cached_tokens == 0
    assert entries[0].logprob is None and entries[0].top == ()
    # The prompt's rows come from 64-wide decodes, whose rounding on this tiny model's large logits
    # (10-20) moves a log-probability by up to 0.025; a row off by one position would be off by units.
    assert [e.logprob for e in entries[1:]] == pytest.approx(alone, abs=5e-2)
    assert all(len(e.top) == 2 and e.top[0].logprob >= e.logprob - 1e-6 for e in entries[1:])  # type: ignore[operator]
    # The reply is the one the prompt gives unscored.
    assert scored.token_ids == plain.token_ids and len(scored.logprobs) == len(plain.token_ids)
    assert plain.prompt_logprobs == ()
    only = run(perfect, LONG, "none", max_tokens=0, prompt_logprobs=0)
    assert only.token_ids == () and [e.logprob for e in only.prompt_logprobs[1:]] == pytest.approx(
        alone, abs=5e-2
    )


def test_a_scored_prompt_reads_only_what_the_last_one_did_not_score(
    perfect: Engine, tiny: LlamaModel
) -> None:
    """lm-evaluation-harness scores each choice of a question after one context: read once."""
    context = tiny.tokenize(LONG)
    choices = [tiny.tokenize(t, add_special=False) for t in (" the lazy dog", " one two three", " x")]

    def score(choice: list[int], n_top: int = 1, cache: bool = True) -> GenerationResult:
        request = GenerationRequest(
            prompt_ids=tuple(context + choice), max_tokens=1, prompt_logprobs=n_top, cache_prompt=cache
        )
        return perfect.generate(request)

    first = score(choices[0], cache=False)
    second = score(choices[1])
    # The shared prefix (the context, and a leading space token here) is kept as far as it was
    # scored, its last position read again to score what follows.
    shared = next(i for i, (a, b) in enumerate(zip(choices[0], choices[1], strict=False)) if a != b)
    shared += len(context)
    assert second.stats.cached_tokens == shared - 1
    assert second.prompt_logprobs[:shared] == first.prompt_logprobs[:shared]
    fresh = score(choices[1], cache=False)
    assert [e.token for e in second.prompt_logprobs] == context + choices[1]
    assert [e.logprob for e in second.prompt_logprobs[1:]] == pytest.approx(
        [e.logprob for e in fresh.prompt_logprobs[1:]], abs=5e-2
    )
    assert second.token_ids == fresh.token_ids
    # Scored with other alternatives, or after a request that scored nothing: read whole.
    assert score(choices[2], n_top=3).stats.cached_tokens == 0
    perfect.generate(GenerationRequest(prompt_ids=tuple(context), max_tokens=1))
    assert score(choices[2]).stats.cached_tokens == 0


def test_a_scored_prompt_streams_first(perfect: Engine) -> None:
    request = GenerationRequest(prompt=PROMPTS[2], max_tokens=6, prompt_logprobs=0, cache_prompt=False)
    handle = perfect.submit(request)
    chunks = list(handle)
    assert handle.result is not None
    assert chunks[0].prompt and chunks[0].text == "" and chunks[0].logprobs == handle.result.prompt_logprobs
    assert chunks[0].token_ids == tuple(e.token for e in handle.result.prompt_logprobs)
    assert not any(c.prompt for c in chunks[1:])
    assert tuple(t for c in chunks[1:] for t in c.token_ids) == handle.result.token_ids


def test_openai_echo_scores_a_prompt_of_token_ids(daemon: Daemon, tiny: LlamaModel) -> None:
    tokens = tiny.tokenize(LONG)
    alone = _prompt_alone(tiny, tokens)
    with daemon.openai() as client:
        out = client.completions.create(
            model="tiny-target", prompt=tokens, max_tokens=0, echo=True, logprobs=1, temperature=0
        )
    choice = out.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    # Ids echo as their tokens' texts: the BOS this vocabulary adds shows its name (as Hugging Face's
    # decode writes it), where a detokenized text has nothing.
    assert tiny.add_bos
    assert choice.text == "".join(lp.tokens) == tiny.token_text(tokens[0]) + tiny.detokenize(tokens)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(alone, abs=5e-2)  # 64-wide decodes' rounding, as above
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (
        len(tokens),
        0,
    )


def _loglikelihood(daemon: Daemon, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """What lm-evaluation-harness's local-completions makes of a loglikelihood request (tokenized,
    batch size 1): the body it sends, read as its parse_logprobs reads the answer."""
    body = {
        "model": "tiny-target",
        "prompt": [context + continuation],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    with daemon.http() as http:
        out = http.post("/v1/completions", json=body).json()
    choice = sorted(out["choices"], key=lambda c: c["index"])[0]
    lps, tops = choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]
    assert len(lps) == len(context) + len(continuation) + 1  # and the one token generated
    ctxlen = len(context)
    greedy = all(lp == max(top.values()) for lp, top in zip(lps[ctxlen:-1], tops[ctxlen:-1], strict=True))
    return sum(lps[ctxlen:-1]), greedy


def test_lm_evaluation_harness_loglikelihood(daemon: Daemon, tiny: LlamaModel) -> None:
    context = tiny.tokenize("the cat sat on")
    own = decode_alone(
        tiny, "the cat sat on", lambda row, seq: int(row.argmax()) if len(seq) < len(context) + 4 else None
    )
    for continuation in (own, tiny.tokenize(" the lazy dog", add_special=False)):
        best: list[int] = []
        alone = _prompt_alone(tiny, context + continuation, best)
        total, greedy = _loglikelihood(daemon, context, continuation)
        assert total == pytest.approx(sum(alone[len(context) - 1 :]), abs=2e-2)
        assert greedy == (best[len(context) - 1 :] == continuation)
    assert _loglikelihood(daemon, context, own)[1]  # the target's own reply is its greedy choice


def test_openai_echo_streamed_and_several_prompts(daemon: Daemon) -> None:
    asked: dict[str, Any] = {"model": "tiny-target", "max_tokens": 6, "temperature": 0, "echo": True}
    with daemon.openai() as client:
        whole = client.completions.create(prompt="one two", logprobs=0, **asked)
        text = whole.choices[0].text
        assert text.startswith("one two") and len(text) > len("one two")
        stream = client.completions.create(prompt="one two", logprobs=0, stream=True, **asked)
        chunks = [c.choices[0] for c in stream if c.choices]
        assert chunks[0].text == "one two" and chunks[0].logprobs is not None
        assert chunks[0].logprobs.token_logprobs is not None and chunks[0].logprobs.token_logprobs[0] is None
        assert "".join(c.text for c in chunks) == text
        # Echo without logprobs: the text alone; several prompts, each with its n choices in order.
        many = client.completions.create(prompt=["one two", "a b c"], n=2, **asked)
        assert [c.index for c in many.choices] == [0, 1, 2, 3]
        assert [c.text.split(" ")[0] for c in many.choices] == ["one", "one", "a", "a"]
        assert many.choices[0].text == text and many.choices[0].logprobs is None
        single = [
            client.completions.create(prompt=p, max_tokens=1, model="tiny-target")
            for p in ("one two", "a b c")
        ]
        assert many.usage is not None
        assert many.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single if s.usage is not None)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": [1, 10**7]}, "prompt token 1 is 10000000, outside"),
        ({"prompt": "x", "echo": True, "suffix": "y"}, "echo cannot be combined with suffix"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens must be at least 1"),
        ({"prompt": []}, "prompt is an empty list"),
        ({"prompt": ["x"] * 33, "n": 2}, "33 prompts x n=2 is more than the 64"),
        ({"prompt": "x", "best_of": 3, "n": 2}, "best_of 3 is not supported"),
    ],
)
def test_completions_prompts_refused_in_one_line(daemon: Daemon, body: dict[str, Any], words: str) -> None:
    with daemon.http() as http:
        out = http.post("/v1/completions", json={"model": "tiny-target", **body})
    assert out.status_code == 400 and words in out.json()["error"]["message"], out.text
