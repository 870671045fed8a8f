"""The OpenAI-compatible routes, driven by the real `openai` package against a real daemon process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from daemonproc import TOKEN, Daemon, start_daemon
from openai.types.chat import ChatCompletionMessageParam

from localspec.server.responses import stats_fields
from localspec.server.schemas import SpeculativeOptions, spec_params
from localspec.types import GenerationStats, SpecParams

pytestmark = pytest.mark.timeout(120)

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_perfect_draft: Path
) -> Iterator[Daemon]:
    """Unix socket plus TCP with a token; the perfect draft, so speculation is visible in the stats."""
    d = start_daemon(
        tmp_path_factory.mktemp("openai-home"),
        tiny_target,
        "--draft",
        str(tiny_perfect_draft),
        tcp=True,
        token=TOKEN,
    )
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def uds_openai(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai() as client:
        yield client


@pytest.fixture
def tcp_openai(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=TOKEN) as client:
        yield client


def _extra(obj: Any, name: str) -> Any:
    extra = obj.model_extra or {}
    return extra[name]


def test_models_lists_the_target(uds_openai: openai.OpenAI, models_dir: Path) -> None:
    # The daemon's own model first, then what discovery finds in the models folder.
    ids = [m.id for m in uds_openai.models.list()]
    assert ids[0] == "tiny-target"
    assert sorted(ids[1:]) == sorted(p.stem for p in models_dir.glob("*.gguf"))


def test_chat_completion_with_usage_and_stats(uds_openai: openai.OpenAI) -> None:
    out = uds_openai.chat.completions.create(model="tiny-target", messages=CHAT, max_tokens=12, temperature=0)
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert out.model == "tiny-target"
    assert out.usage is not None
    assert out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    stats = _extra(out, "localspec")
    assert stats["tokens"] == out.usage.completion_tokens
    assert {"tokens_per_second", "acceptance_rate", "drafted", "accepted", "method"} <= stats.keys()
    timings = _extra(out, "timings")
    assert timings["predicted_n"] == out.usage.completion_tokens
    # As llama-server's: the generation's time is after the first token (the prompt's is before it),
    # its speed the tokens after the first over it; editor plugins show it beside llama-server's.
    assert timings["prompt_ms"] + timings["predicted_ms"] == pytest.approx(
        stats["elapsed_s"] * 1000, abs=0.01
    )
    after_first = (timings["predicted_n"] - 1) / (timings["predicted_ms"] / 1000)
    assert timings["predicted_per_second"] == pytest.approx(after_first, rel=1e-3)
    assert timings["predicted_per_second"] > stats["tokens_per_second"]
    # Asked again, the prompt is in the cache but for its last token, read again for its logits.
    again = uds_openai.chat.completions.create(
        model="tiny-target", messages=CHAT, max_tokens=12, temperature=0
    )
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_stream_equals_non_stream_and_reports_usage(uds_openai: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "localspec", "messages": CHAT, "max_tokens": 40, "temperature": 0}
    whole = uds_openai.chat.completions.create(**kwargs)
    chunks = list(
        uds_openai.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[0].choices[0].delta.role == "assistant"


def test_max_tokens_ends_with_length(uds_openai: openai.OpenAI) -> None:
    out = uds_openai.completions.create(
        model="tiny-target", prompt="the model is", max_tokens=5, temperature=0
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 5


def test_stop_string_cuts_the_text(uds_openai: openai.OpenAI) -> None:
    full = uds_openai.completions.create(
        model="tiny-target", prompt="the model is", max_tokens=30, temperature=0
    )
    words = full.choices[0].text.split()
    assert len(words) > 4
    stop = f" {words[3]}"
    cut = uds_openai.completions.create(
        model="tiny-target", prompt="the model is", max_tokens=30, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full.choices[0].text[: full.choices[0].text.index(stop)]


def test_seed_makes_sampling_reproducible(uds_openai: openai.OpenAI) -> None:
    def sample(seed: int) -> str | None:
        # A fixed method: `auto` decides from measured timings, and its drafts change how the seed is used.
        out = uds_openai.chat.completions.create(
            model="tiny-target",
            messages=CHAT,
            max_tokens=20,
            temperature=1.0,
            top_p=0.95,
            seed=seed,
            extra_body={"speculative": {"method": "ngram"}},
        )
        return out.choices[0].message.content

    assert sample(7) == sample(7)


def test_frequency_and_presence_penalties_change_the_reply_alike_for_every_method(
    uds_openai: openai.OpenAI,
) -> None:
    def reply(method: str, frequency: float = 0.0, presence: float = 0.0) -> str | None:
        out = uds_openai.completions.create(
            model="tiny-target",
            prompt="one two three one two",
            max_tokens=24,
            temperature=0,
            frequency_penalty=frequency,
            presence_penalty=presence,
            extra_body={"speculative": {"method": method}},
        )
        return out.choices[0].text

    plain = reply("none")
    penalised = reply("none", 1.5, 1.0)
    assert penalised != plain
    assert reply("draft", 1.5, 1.0) == penalised


def test_n_choices_each_with_its_own_seed_whole_and_streamed(uds_openai: openai.OpenAI) -> None:
    def choices(n: int, seed: int) -> list[str]:
        out = uds_openai.chat.completions.create(
            model="tiny-target", messages=CHAT, max_tokens=12, temperature=1.0, seed=seed, n=n
        )
        assert [c.index for c in out.choices] == list(range(n))
        assert out.usage is not None and out.usage.completion_tokens >= n
        return [c.message.content or "" for c in out.choices]

    three = choices(3, 7)
    assert three == choices(3, 7) and len(set(three)) > 1  # reproducible, and not one reply thrice
    assert choices(1, 7) == three[:1]  # the first choice is the request's own seed
    stream = uds_openai.chat.completions.create(
        model="tiny-target", messages=CHAT, max_tokens=12, temperature=1.0, seed=7, n=3, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    texts = ["", "", ""]
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
        usage = chunk.usage or usage
    assert texts == three and usage is not None and usage.completion_tokens >= 3
    greedy = uds_openai.completions.create(
        model="tiny-target", prompt="one two", max_tokens=8, temperature=0, n=2
    )
    assert greedy.choices[0].text == greedy.choices[1].text


def test_speculative_extension_picks_the_method(uds_openai: openai.OpenAI) -> None:
    def run(method: str, k: int | None = 3) -> tuple[str | None, dict[str, Any]]:
        out = uds_openai.chat.completions.create(
            model="tiny-target",
            messages=CHAT,
            max_tokens=24,
            temperature=0,
            extra_body={"speculative": {"method": method, "k": k}},
        )
        return out.choices[0].message.content, _extra(out, "localspec")

    plain_text, plain = run("none")
    draft_text, drafted = run("draft")
    assert draft_text == plain_text  # lossless
    assert plain["method"] == "none" and plain["drafted"] == 0 and plain["k"] == 0
    assert drafted["method"] == "draft" and drafted["k"] == 3
    assert drafted["drafted"] > 0 and 1.0 <= drafted["mean_k"] <= 3.0
    assert drafted["accepted"] > 0  # the perfect draft agrees with the target
    assert run("draft", None)[1]["k"] == 4  # no k: the daemon's default
    auto_text, auto = run("auto", 2)
    assert auto_text == plain_text
    assert auto["k"] == 2 and len(auto["drafted_by_position"]) <= 2 and auto["mean_k"] <= 2.0


def test_a_request_k_overrides_the_daemon_default_and_none_keeps_it() -> None:
    options = SpeculativeOptions.model_validate
    assert spec_params(options({"method": "auto"}), SpecParams("draft", None)) == SpecParams("auto", None)
    assert spec_params(options({"k": 2}), SpecParams("auto", None)) == SpecParams("auto", 2)
    assert spec_params(options({"method": "ngram"}), SpecParams("auto", 6)) == SpecParams("ngram", 6)
    assert spec_params(None, SpecParams("auto", 6)) == SpecParams("auto", 6)


def test_streamed_chunks_carry_token_ids(daemon: Daemon) -> None:
    body = {"model": "tiny-target", "messages": CHAT, "max_tokens": 8, "temperature": 0, "stream": True}
    with daemon.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert '"token_ids":[' in lines[0]


def test_tcp_with_the_token(tcp_openai: openai.OpenAI) -> None:
    out = tcp_openai.chat.completions.create(model="tiny-target", messages=CHAT, max_tokens=4, temperature=0)
    assert out.choices[0].message.content


def test_tcp_without_the_token_is_refused(daemon: Daemon) -> None:
    with (
        openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as info,
    ):
        client.models.list()
    assert info.value.status_code == 401
    with daemon.tcp_http() as http:
        response = http.get("/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def test_unknown_model_is_404(uds_openai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        uds_openai.chat.completions.create(model="../../etc/passwd", messages=CHAT, max_tokens=2)
    body: Any = info.value.body
    assert body["code"] == "model_not_found"
    assert body["param"] == "model"


def test_routes_without_v1_as_llama_server_serves_them(daemon: Daemon) -> None:
    """Clients configured with the bare base URL (llama-server's) call /chat/completions and /models."""
    with daemon.openai(path="") as client, daemon.http() as http:
        assert next(m.id for m in client.models.list()) == "tiny-target"
        chat = client.chat.completions.create(model="tiny-target", messages=CHAT, max_tokens=8, temperature=0)
        text = client.completions.create(model="tiny-target", prompt="the model", max_tokens=8, temperature=0)
        with_v1 = http.post(
            "/v1/chat/completions",
            json={"model": "tiny-target", "messages": CHAT, "max_tokens": 8, "temperature": 0},
        ).json()
    assert chat.choices[0].message.content == with_v1["choices"][0]["message"]["content"]
    assert text.choices[0].text


def test_cache_prompt_false_evaluates_the_prompt_afresh(daemon: Daemon) -> None:
    """llama-server's cache_prompt on chat and completions: false reuses none of the last prompt."""
    body = {"model": "tiny-target", "messages": CHAT, "max_tokens": 4, "temperature": 0}
    with daemon.http() as http:
        http.post("/v1/chat/completions", json=body).raise_for_status()
        cached = http.post("/v1/chat/completions", json=body).json()
        fresh = http.post("/v1/chat/completions", json={**body, "cache_prompt": False}).json()
        plain = {"model": "tiny-target", "prompt": "the quick brown fox", "max_tokens": 4, "temperature": 0}
        http.post("/v1/completions", json=plain).raise_for_status()
        text_fresh = http.post("/v1/completions", json={**plain, "cache_prompt": False}).json()
    assert cached["localspec"]["cached_tokens"] > 0
    assert fresh["localspec"]["cached_tokens"] == 0
    assert fresh["choices"][0]["message"]["content"] == cached["choices"][0]["message"]["content"]
    assert text_fresh["localspec"]["cached_tokens"] == 0


def test_llama_vscode_chat_edit_payloads(daemon: Daemon) -> None:
    """llama.vscode's edit request (llama-server's fields, max_tokens -1) and its n_predict 0 warm-up."""
    messages = [{"role": "system", "content": "You are an expert coder."}, {"role": "user", "content": "the"}]
    warmup = {"messages": messages, "n_predict": 0, "samplers": [], "cache_prompt": True,
              "t_max_prompt_ms": 500, "t_max_predict_ms": 1, "model": "tiny-target"}  # fmt: skip
    edit = {"messages": messages, "stream": False, "cache_prompt": True, "samplers": "edkypmxt",
            "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1,
            "repeat_penalty": 1, "dry_multiplier": 0, "max_tokens": -1, "timings_per_token": False,
            "model": "tiny-target", "seed": 7}  # fmt: skip
    with daemon.http() as http:
        warm = http.post("/v1/chat/completions", json=warmup).json()
        done = http.post("/v1/chat/completions", json=edit).json()
    assert warm["choices"][0]["message"]["content"] == "" and warm["usage"]["completion_tokens"] == 0
    assert warm["choices"][0]["finish_reason"] == "length"
    assert done["choices"][0]["message"]["content"] and done["usage"]["completion_tokens"] > 0
    assert done["localspec"]["cached_tokens"] == warm["usage"]["prompt_tokens"] - 1


def test_timings_of_a_request_that_generated_nothing_are_all_the_prompt_s() -> None:
    # A completion that ends before its first token (a stop while the prompt was read, llama.vim's
    # time budget spent on a long prompt) has no time to first token: all its time was the prompt's.
    stats = GenerationStats(prompt_tokens=1761, tokens=0, elapsed_s=15.775, ttft_s=0.0)
    timings = stats_fields(stats)["timings"]
    assert timings["prompt_ms"] == pytest.approx(15775.0)
    assert timings["prompt_per_second"] == pytest.approx(1761 / 15.775, rel=1e-3)
    assert (timings["predicted_n"], timings["predicted_ms"], timings["predicted_per_second"]) == (0, 0.0, 0.0)
