"""The Ollama-compatible routes, driven by the real `ollama` package against a real daemon process.

The daemon here serves a tiny model that has fill-in-the-middle tokens, so
`suffix` runs for real; its answers are compared with the engine run in-process.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest
import tinymodels
from daemonproc import Daemon, free_port, run_cli, start_daemon

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.timeout(120)

GREEDY = {"temperature": 0}
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@pytest.fixture(scope="module")
def fim_target(tiny_dir: Path) -> Path:
    vocab = tinymodels.build_vocab(extra_tokens=(tinymodels.IM_START, tinymodels.IM_END, *FIM_TOKENS))
    path = tiny_dir / "tiny-fim.gguf"
    return tinymodels.write_tiny_model(
        path, vocab=vocab, name="tiny-fim", basename="Tiny-Coder", size_label="3M"
    )


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The daemon's models folder, where /api/pull writes and /api/delete removes."""
    return tmp_path_factory.mktemp("pulled")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, fim_target: Path, pulled: Path) -> Iterator[Daemon]:
    """Unix socket plus loopback TCP without a token; a Hugging Face endpoint nothing listens on."""
    hf = {
        "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "HF_HOME": str(tmp_path_factory.mktemp("hf")),
        "LOCALSPEC_MODELS": str(pulled),
    }
    d = start_daemon(tmp_path_factory.mktemp("ollama-home"), fim_target, tcp=True, ctx=1024, env=hf)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def uds_ollama(daemon: Daemon) -> Iterator[ollama.Client]:
    with daemon.ollama() as client:
        yield client


@pytest.fixture
def tcp_ollama(daemon: Daemon) -> Iterator[ollama.Client]:
    with ollama.Client(host=daemon.base_url) as client:
        yield client


def _in_process(target: Path, request: GenerationRequest) -> str:
    with Engine(EngineConfig(target=target, load=LoadOptions(n_ctx=1024, n_threads=1))) as engine:
        return engine.generate(request).text


def test_version_tags_and_show(uds_ollama: ollama.Client, daemon: Daemon, fim_target: Path) -> None:
    with daemon.http() as http:
        assert http.get("/api/version").json()["version"]
    listed = uds_ollama.list()
    assert [m.model for m in listed.models] == ["tiny-fim:latest"]
    assert listed.models[0].details is not None and listed.models[0].details.format == "gguf"
    assert listed.models[0].size == fim_target.stat().st_size and listed.models[0].digest
    shown = uds_ollama.show("tiny-fim")
    assert shown.template and "<|im_start|>user\n{{ .Content }}<|im_end|>" in shown.template
    # Ollama's FIM form, with this model's own markers; no tool instructions without tool support.
    assert "{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>" in (
        shown.template
    )
    assert ".Tools" not in shown.template
    assert shown.capabilities == ["completion", "insert"]
    # The context the daemon serves (--ctx 1024), not the 2048 the GGUF was written with.
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 1024
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["general.basename"] == "Tiny-Coder"
    assert shown.parameters is not None and re.search(r"^num_ctx +1024$", shown.parameters, re.M)
    assert shown.details is not None and shown.details.parameter_size == "3M"
    with daemon.http() as http:
        by_name = http.post("/api/show", json={"name": "tiny-fim:latest"}).json()
    assert by_name["template"] == shown.template and by_name["capabilities"] == shown.capabilities


def test_chat_stream_equals_non_stream(uds_ollama: ollama.Client) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    options = {**GREEDY, "num_predict": 30}
    whole = uds_ollama.chat(model="tiny-fim", messages=messages, options=options)
    parts = list(uds_ollama.chat(model="tiny-fim", messages=messages, options=options, stream=True))
    assert whole.message.content
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert parts[-1].eval_count == whole.eval_count
    assert whole.done_reason in ("stop", "length")


def test_generate_options_num_predict_and_stats(tcp_ollama: ollama.Client, daemon: Daemon) -> None:
    out = tcp_ollama.generate(model="tiny-fim", prompt="the model is", options={**GREEDY, "num_predict": 6})
    assert out.done and out.done_reason == "length"
    assert out.eval_count == 6
    # The ollama package drops fields it does not know; the speculation stats are in the raw body.
    body = {
        "model": "tiny-fim",
        "prompt": "the model is",
        "stream": False,
        "options": {**GREEDY, "num_predict": 6},
    }
    with daemon.tcp_http() as http:
        stats = http.post("/api/generate", json=body).json()["localspec"]
    assert stats["tokens"] == 6 and "acceptance_rate" in stats and stats["method"]


def test_generate_stop_and_seed(tcp_ollama: ollama.Client) -> None:
    full = tcp_ollama.generate(
        model="tiny-fim", prompt="one two", raw=True, options={**GREEDY, "num_predict": 30}
    )
    full_text = full.response or ""
    words = full_text.split()
    assert len(words) > 3
    stop = f" {words[2]}"
    cut = tcp_ollama.generate(
        model="tiny-fim", prompt="one two", raw=True, options={**GREEDY, "num_predict": 30, "stop": [stop]}
    )
    assert cut.response == full_text[: full_text.index(stop)]
    assert cut.done_reason == "stop"
    sampled = {"temperature": 1.0, "seed": 11, "num_predict": 20}
    first = tcp_ollama.generate(model="tiny-fim", prompt="one two", options=sampled).response
    assert tcp_ollama.generate(model="tiny-fim", prompt="one two", options=sampled).response == first


def test_repeat_penalty_options_change_the_reply(tcp_ollama: ollama.Client) -> None:
    def reply(**options: float) -> str | None:
        opts = {**GREEDY, "num_predict": 24, **options}
        return tcp_ollama.generate(
            model="tiny-fim", prompt="one two one two", raw=True, options=opts
        ).response

    plain = reply()
    assert reply(repeat_penalty=1.0) == plain  # Ollama's default: no penalty
    penalised = reply(repeat_penalty=1.8, repeat_last_n=-1)
    assert penalised != plain and reply(repeat_penalty=1.8, repeat_last_n=0) == plain


def test_generate_context_carries_the_exchange_into_the_next_request(
    tcp_ollama: ollama.Client, daemon: Daemon
) -> None:
    """Ollama's `context` (deprecated there, still sent): the final answer's tokens are the prompt's and
    the reply's; sent back, they are read before the next prompt, as a conversation."""
    first = tcp_ollama.generate(model="tiny-fim", prompt="one two", options={**GREEDY, "num_predict": 6})
    context = list(first.context or [])
    assert first.prompt_eval_count is not None and first.eval_count == 6
    assert len(context) == first.prompt_eval_count + first.eval_count
    with daemon.tcp_http() as http:
        text = http.post("/detokenize", json={"tokens": context}).json()["content"]
    assert text.endswith(first.response or "") and "one two" in text
    second = tcp_ollama.generate(
        model="tiny-fim", prompt="three", context=context, options={**GREEDY, "num_predict": 4}
    )
    assert list(second.context or [])[: len(context)] == context
    assert second.prompt_eval_count is not None and second.prompt_eval_count > len(context)
    # Streamed, the last line carries it; raw answers carry none, and take none.
    body = {"model": "tiny-fim", "prompt": "one two", "options": {**GREEDY, "num_predict": 6}}
    with daemon.tcp_http() as http:
        lines = [json.loads(line) for line in http.post("/api/generate", json=body).text.splitlines()]
        assert lines[-1]["context"] == context and "context" not in lines[0]
        raw = http.post("/api/generate", json={**body, "raw": True, "stream": False}).json()
        assert "context" not in raw
        refused = http.post("/api/generate", json={**body, "raw": True, "context": context})
        assert refused.status_code == 400 and "context is not read with raw" in refused.json()["error"]
        bad = http.post("/api/generate", json={**body, "context": [10**7]})
        assert bad.status_code == 400 and "context token 0 is 10000000" in bad.json()["error"]


def test_a_context_grown_past_the_window_loses_its_oldest_tokens(
    tcp_ollama: ollama.Client, daemon: Daemon
) -> None:
    """A conversation kept in `context` outgrows the context window: Ollama cuts the oldest tokens
    (after the first), and so does localspec; `truncate: false` gets the error."""
    first = tcp_ollama.generate(model="tiny-fim", prompt="one two", options={**GREEDY, "num_predict": 6})
    exchange = list(first.context or [])
    grown = exchange * (1100 // len(exchange) + 1)  # past the 1,024-token context with the prompt
    options = {**GREEDY, "num_predict": 4}
    reply = tcp_ollama.generate(model="tiny-fim", prompt="three", context=grown, options=options)
    assert reply.prompt_eval_count is not None and 1024 // 2 < reply.prompt_eval_count <= 1024 - 4
    # The prompt's own tokens, as read after a context that fits.
    short = tcp_ollama.generate(model="tiny-fim", prompt="three", context=exchange, options=options)
    assert short.prompt_eval_count is not None
    own = list(short.context or [])[len(exchange) : short.prompt_eval_count]
    kept = reply.prompt_eval_count - len(own)  # of the context: its first token and its latest
    assert 1 < kept < len(grown)
    read = list(reply.context or [])
    assert read[:kept] == [grown[0], *grown[len(grown) - kept + 1 :]] and read[kept : kept + len(own)] == own
    body = {"model": "tiny-fim", "prompt": "three", "context": grown, "stream": False, "options": options}
    with daemon.tcp_http() as http:
        refused = http.post("/api/generate", json={**body, "truncate": False})
    assert refused.status_code == 400 and "the context holds 1024" in refused.json()["error"]


def test_generate_streams_ndjson_by_default(daemon: Daemon) -> None:
    body = {"model": "tiny-fim", "prompt": "hello", "options": {"num_predict": 5, **GREEDY}}
    with daemon.http() as http, http.stream("POST", "/api/generate", json=body) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["eval_count"] == 5


def test_suffix_is_fill_in_the_middle(uds_ollama: ollama.Client, fim_target: Path) -> None:
    prefix, suffix = "def main(self):", "return None"
    out = uds_ollama.generate(
        model="tiny-fim", prompt=prefix, suffix=suffix, options={**GREEDY, "num_predict": 10}
    )
    expected = _in_process(fim_target, GenerationRequest(prompt=prefix, suffix=suffix, max_tokens=10))
    assert out.response == expected


def test_openai_completions_suffix_too(daemon: Daemon, fim_target: Path) -> None:
    body = {
        "model": "tiny-fim",
        "prompt": "import numpy",
        "suffix": "print",
        "max_tokens": 8,
        "temperature": 0,
    }
    with daemon.http() as http:
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    expected = _in_process(
        fim_target,
        GenerationRequest(prompt="import numpy", suffix="print", max_tokens=8, sampling=SamplingParams()),
    )
    assert response.json()["choices"][0]["text"] == expected


def test_empty_prompt_only_loads(uds_ollama: ollama.Client) -> None:
    out = uds_ollama.generate(model="tiny-fim")
    assert out.done and out.done_reason == "load" and out.response == ""
    chat = uds_ollama.chat(model="tiny-fim", messages=[])
    assert chat.done and chat.done_reason == "load" and chat.message.content == ""


def test_ollama_errors_have_ollama_shape(uds_ollama: ollama.Client, daemon: Daemon) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        uds_ollama.chat(model="llama3:latest", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404
    assert "not loaded" in info.value.error
    with daemon.http() as http:
        response = http.post("/api/chat", content=b"{not json")
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str)


def test_a_prompt_template_of_the_requests_own_is_refused_unless_raw(uds_ollama: ollama.Client) -> None:
    """Ollama's `template` replaces the model's: refused by name, not ignored (the reply would
    follow another format than the one asked for); with raw it does not apply, as in Ollama."""
    template = "<|user|>{{ .Prompt }}<|assistant|>"
    with pytest.raises(ollama.ResponseError) as info:
        uds_ollama.generate(model="tiny-fim", prompt="hello", template=template)
    assert info.value.status_code == 400 and "template" in info.value.error and "raw" in info.value.error
    raw = uds_ollama.generate(
        model="tiny-fim", prompt="hello", template=template, raw=True, options={"num_predict": 2}
    )
    assert raw.done


def test_model_tag_latest_is_accepted(uds_ollama: ollama.Client) -> None:
    out = uds_ollama.generate(model="tiny-fim:latest", prompt="hi", options={**GREEDY, "num_predict": 2})
    assert out.model == "tiny-fim"


def test_ps_reports_the_loaded_model_and_its_context(
    uds_ollama: ollama.Client, daemon: Daemon, fim_target: Path
) -> None:
    running = uds_ollama.ps().models
    assert [m.model for m in running] == ["tiny-fim:latest"]
    # Ollama reports the memory a loaded model takes: its weights, KV cache and compute buffers.
    assert (running[0].size or 0) > fim_target.stat().st_size and running[0].expires_at is not None
    assert running[0].size_vram == 0  # the tiny model runs on the CPU here
    with daemon.http() as http:
        assert http.get("/api/ps").json()["models"][0]["context_length"] == 1024


@pytest.mark.parametrize("name", ["tiny-coder:3m", "TinyCoder:3M", "tiny_coder:latest", "tiny-coder:3m-f32"])
def test_ollama_style_names_resolve_from_gguf_metadata(uds_ollama: ollama.Client, name: str) -> None:
    out = uds_ollama.generate(model=name, prompt="hi", options={**GREEDY, "num_predict": 2})
    assert out.model == "tiny-fim"
    assert uds_ollama.show(name).capabilities == ["completion", "insert"]


@pytest.mark.parametrize("name", ["tiny-coder:7b", "qwen2.5-coder:3m", "tiny-coder:3m-base"])
def test_other_ollama_names_are_not_found(uds_ollama: ollama.Client, name: str) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        uds_ollama.generate(model=name, prompt="hi", options={"num_predict": 2})
    assert info.value.status_code == 404 and "not loaded" in info.value.error


@pytest.mark.parametrize("keep_alive", [300, "5m", "1h30m", -1, "0", 0])
def test_keep_alive_number_or_duration(uds_ollama: ollama.Client, keep_alive: float | str) -> None:
    out = uds_ollama.generate(
        model="tiny-fim", prompt="hi", keep_alive=keep_alive, options={**GREEDY, "num_predict": 2}
    )
    assert out.done


def test_bad_keep_alive_is_a_clear_400(daemon: Daemon) -> None:
    with daemon.http() as http:
        response = http.post("/api/generate", json={"model": "tiny-fim", "prompt": "x", "keep_alive": "soon"})
    assert response.status_code == 400
    assert "keep_alive" in response.json()["error"] and "5m" in response.json()["error"]


def test_num_ctx_up_to_the_served_context(uds_ollama: ollama.Client) -> None:
    messages = [{"role": "user", "content": "hi"}]
    small = uds_ollama.chat(
        model="tiny-fim", messages=messages, options={**GREEDY, "num_ctx": 512, "num_predict": 3}
    )
    assert small.done and small.eval_count == 3
    same = uds_ollama.generate(
        model="tiny-fim", prompt="hi", options={**GREEDY, "num_ctx": 1024, "num_predict": 3}
    )
    assert same.done
    with pytest.raises(ollama.ResponseError) as info:
        uds_ollama.chat(model="tiny-fim", messages=messages, options={"num_ctx": 8192})
    assert info.value.status_code == 400
    assert "8192" in info.value.error and "1024" in info.value.error and "--ctx" in info.value.error


def test_a_smaller_num_ctx_holds_the_prompt_to_it(uds_ollama: ollama.Client, daemon: Daemon) -> None:
    """As Ollama runs a model at num_ctx: a chat past it drops its oldest messages, a generate
    prompt past it loses its middle (Ollama's "truncating input prompt"), and with `truncate:
    false` it is refused, where the served context (1024) would hold them whole."""
    messages = _long_chat(20)
    whole = uds_ollama.chat(model="tiny-fim", messages=messages, options={**GREEDY, "num_predict": 2})
    assert whole.prompt_eval_count is not None and 256 < whole.prompt_eval_count < 1024 - 2
    held = uds_ollama.chat(
        model="tiny-fim", messages=messages, options={**GREEDY, "num_predict": 2, "num_ctx": 256}
    )
    assert held.done and held.prompt_eval_count is not None and held.prompt_eval_count <= 256 - 2
    prompt = " ".join(f"line {i} of the parser test" for i in range(60))
    cut = uds_ollama.generate(
        model="tiny-fim", prompt=prompt, raw=True, options={**GREEDY, "num_predict": 2, "num_ctx": 256}
    )
    assert cut.done and cut.prompt_eval_count == 256 - (256 - 5) // 2
    body: dict[str, Any] = {"model": "tiny-fim", "stream": False, "truncate": False}
    with daemon.http() as http:
        refused = http.post(
            "/api/generate", json={**body, "prompt": prompt, "raw": True, "options": {"num_ctx": 256}}
        )
        fits = http.post(
            "/api/generate", json={**body, "prompt": prompt, "raw": True, "options": {"num_predict": 2}}
        )
    assert refused.status_code == 400 and "the context holds 256" in refused.json()["error"]
    assert fits.status_code == 200 and fits.json()["prompt_eval_count"] > 256


def _long_chat(turns: int) -> list[dict[str, str]]:
    words = "the model reads the file and writes the test for the parser"
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"{i} {words} {words}"} for i in range(turns)]


def test_a_chat_longer_than_the_context_drops_its_oldest_messages(
    uds_ollama: ollama.Client, daemon: Daemon
) -> None:
    """As Ollama does (truncate, on by default): system messages and the latest message stay."""
    system = {"role": "system", "content": "you write tests"}
    messages = [system, *_long_chat(59)]
    whole = uds_ollama.chat(model="tiny-fim", messages=messages, options={**GREEDY, "num_predict": 4})
    assert whole.done and whole.eval_count == 4
    assert whole.prompt_eval_count is not None and 1024 // 2 < whole.prompt_eval_count <= 1024 - 4
    # The daemon's cut is one made by hand (truncate off) at a user turn: the same prompt, the same reply.
    body: dict[str, Any] = {"model": "tiny-fim", "stream": False, "truncate": False}
    with daemon.http() as http:
        for start in range(1, len(messages), 2):  # the user turns
            cut = {**body, "messages": [system, *messages[start:]], "options": {**GREEDY, "num_predict": 4}}
            again = http.post("/api/chat", json=cut)
            if again.status_code == 200 and again.json()["prompt_eval_count"] == whole.prompt_eval_count:
                break
        else:
            raise AssertionError("no cut at a user turn is the prompt the daemon read")
    assert messages[start]["role"] == "user" and start > 1
    assert again.json()["message"]["content"] == whole.message.content
    # The raw body says how many went (the ollama package drops fields it does not know).
    body = {"model": "tiny-fim", "messages": messages, "stream": False}
    with daemon.http() as http:
        stats = http.post("/api/chat", json={**body, "options": {"num_predict": 4}}).json()["localspec"]
        assert stats["dropped_messages"] == start - 1 and stats["prompt_tokens"] == whole.prompt_eval_count
        # truncate: false (the ollama package does not send it; Ollama reads it) is the engine's error.
        refused = http.post("/api/chat", json={**body, "truncate": False})
    assert refused.status_code == 400 and "the context holds 1024" in refused.json()["error"]
    # A latest message too long by itself loses its middle, as Ollama's runner cuts a prompt: its
    # first 5 tokens and its latest, about half the context (truncate: false, the one-line error).
    alone = [system, {"role": "user", "content": " ".join(m["content"] for m in messages[1:])}]
    single = uds_ollama.chat(model="tiny-fim", messages=alone, options={**GREEDY, "num_predict": 4})
    assert single.done and single.prompt_eval_count == 1024 - (1024 - 5) // 2
    with daemon.http() as http:
        refused = http.post("/api/chat", json={**body, "messages": alone, "truncate": False})
    assert refused.status_code == 400 and "the context holds 1024" in refused.json()["error"]


def test_a_generate_prompt_past_the_context_loses_its_middle(
    uds_ollama: ollama.Client, daemon: Daemon
) -> None:
    """As Ollama's runner cuts it: the first 5 tokens and the latest, about half the context; the
    count in localspec.dropped_tokens; truncate: false, the one-line error."""
    prompt = " ".join(f"line {i} of the parser test" for i in range(400))
    answer = uds_ollama.generate(
        model="tiny-fim", prompt=prompt, raw=True, options={**GREEDY, "num_predict": 4}
    )
    assert answer.done and answer.prompt_eval_count == 1024 - (1024 - 5) // 2
    body: dict[str, Any] = {"model": "tiny-fim", "prompt": prompt, "raw": True, "stream": False}
    with daemon.http() as http:
        stats = http.post("/api/generate", json={**body, "options": {"num_predict": 4}}).json()["localspec"]
        refused = http.post("/api/generate", json={**body, "truncate": False})
        whole = len(http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
    assert whole > 2 * 1024
    assert stats["prompt_tokens"] == answer.prompt_eval_count
    assert stats["dropped_tokens"] == whole - answer.prompt_eval_count
    assert refused.status_code == 400 and "the context holds 1024" in refused.json()["error"]


def test_openai_chat_truncates_only_when_asked(daemon: Daemon) -> None:
    """OpenAI's chat refuses a prompt past the context; localspec's `truncate` cuts it as Ollama does."""
    messages: list[Any] = [{"role": "system", "content": "you write tests"}, *_long_chat(59)]
    with daemon.openai(max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny-fim", messages=messages, max_tokens=4)
        assert "maximum context length is 1024 tokens" in str(refused.value)
        cut = client.chat.completions.create(
            model="tiny-fim", messages=messages, max_tokens=4, temperature=0, extra_body={"truncate": True}
        )
    extra = cut.model_extra or {}
    assert cut.usage is not None and cut.usage.prompt_tokens <= 1024 - 4
    assert extra["localspec"]["dropped_messages"] > 0


def _pull_error(daemon: Daemon, name: str) -> ollama.ResponseError:
    with daemon.ollama() as client, pytest.raises(ollama.ResponseError) as refused:
        client.pull(name)
    return refused.value


def test_pull_reports_an_unreachable_hub_in_ollama_shape(daemon: Daemon, uds_ollama: ollama.Client) -> None:
    # Both pulls at once, which the daemon serves side by side; a refused connection is told by one
    # try (hub.unreachable), not after the hub client's five retries.
    with ThreadPoolExecutor(1) as pool:
        whole = pool.submit(_pull_error, daemon, "acme/Tiny-GGUF:tiny.gguf")
        events = []
        with pytest.raises(ollama.ResponseError) as streamed:
            for event in uds_ollama.pull("hf.co/acme/Tiny-GGUF:Q4_K_M", stream=True):
                events.append(event.status)
        assert events == ["pulling manifest"]
        assert "cannot download acme/Tiny-GGUF" in streamed.value.error
        assert "Connection refused" in streamed.value.error
        error = whole.result(timeout=120)
    assert error.status_code == 502 and "Connection refused" in error.error


def test_pull_names(uds_ollama: ollama.Client) -> None:
    assert uds_ollama.pull("tiny-coder:3m").status == "success"  # the served model: nothing to fetch
    with pytest.raises(ollama.ResponseError) as library:
        uds_ollama.pull("llama3.2:1b")
    assert library.value.status_code == 400 and "hf.co/OWNER/REPO" in library.value.error
    with pytest.raises(ollama.ResponseError) as malformed:
        uds_ollama.pull("hf.co/not a repo")
    assert malformed.value.status_code == 400


def _tag_names(client: ollama.Client) -> set[str]:
    return {m.model or "" for m in client.list().models}


def _await_listed(client: ollama.Client, name: str) -> None:
    """Until the catalog's next scan sees a file just written (it rescans at most once a second)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            client.show(name)
            return
        except ollama.ResponseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_delete_removes_a_model_from_the_models_folder_even_while_loaded(
    uds_ollama: ollama.Client, pulled: Path, daemon: Daemon
) -> None:
    path = tinymodels.write_tiny_model(pulled / "scratch.gguf", seed=3, name="scratch")
    _await_listed(uds_ollama, "scratch")
    assert uds_ollama.generate(model="scratch", prompt="hello", options={"num_predict": 2}).done
    assert "scratch" in {m.model.removesuffix(":latest") for m in uds_ollama.ps().models if m.model}
    assert uds_ollama.delete("scratch").status == "success"
    assert not path.exists() and "scratch:latest" not in _tag_names(uds_ollama)
    deadline = time.monotonic() + 30
    while any(m.model == "scratch:latest" for m in uds_ollama.ps().models) and time.monotonic() < deadline:
        time.sleep(0.05)  # unloaded once idle, off the event loop
    assert all(m.model != "scratch:latest" for m in uds_ollama.ps().models)
    with pytest.raises(ollama.ResponseError) as gone:
        uds_ollama.delete("scratch")
    assert gone.value.status_code == 404
    # `localspec rm` goes through the running daemon, by the same rule.
    again = tinymodels.write_tiny_model(pulled / "scratch2.gguf", seed=3, name="scratch2")
    _await_listed(uds_ollama, "scratch2")
    done = run_cli(daemon.home, "rm", "scratch2")
    assert done.returncode == 0 and done.stdout.strip() == "deleted scratch2", done.stderr
    assert not again.exists()
    refused = run_cli(daemon.home, "rm", "tiny-fim")
    assert refused.returncode == 2 and "stop the daemon" in refused.stderr


def test_delete_removes_every_part_of_a_split_model(uds_ollama: ollama.Client, pulled: Path) -> None:
    first = tinymodels.write_tiny_model(pulled / "halves.gguf", seed=4, name="halves", split_max_tensors=4)
    parts = sorted(pulled.glob("halves-*-of-*.gguf"))
    assert len(parts) > 1 and first == parts[0]
    _await_listed(uds_ollama, first.stem)
    assert uds_ollama.delete(first.stem).status == "success"
    assert not any(p.exists() for p in parts)


def test_delete_leaves_what_is_not_the_models_folders_own(
    uds_ollama: ollama.Client, pulled: Path, tmp_path: Path
) -> None:
    outside = tinymodels.write_tiny_model(tmp_path / "elsewhere.gguf", seed=6, name="elsewhere")
    (pulled / "linked.gguf").symlink_to(outside)
    try:
        _await_listed(uds_ollama, "linked")
        with pytest.raises(ollama.ResponseError) as linked:
            uds_ollama.delete("linked")
        assert linked.value.status_code == 400 and "is a link to" in linked.value.error
        assert outside.exists() and (pulled / "linked.gguf").is_symlink()
    finally:
        (pulled / "linked.gguf").unlink()
    with pytest.raises(ollama.ResponseError) as own:
        uds_ollama.delete("tiny-fim")  # the model the daemon was started with
    assert own.value.status_code == 400 and "stop the daemon" in own.value.error


def test_create_copy_push_and_blobs_say_what_to_do_instead(uds_ollama: ollama.Client, daemon: Daemon) -> None:
    with pytest.raises(ollama.ResponseError) as copy:
        uds_ollama.copy("tiny-fim", "mine")
    assert (
        copy.value.status_code == 501 and "copy or link the GGUF into the models folder" in copy.value.error
    )
    with pytest.raises(ollama.ResponseError) as create:
        uds_ollama.create("mine", from_="tiny-fim", system="be brief")
    assert create.value.status_code == 501 and "localspec pull" in create.value.error
    with pytest.raises(ollama.ResponseError) as push:
        uds_ollama.push("tiny-fim")
    assert push.value.status_code == 501 and "Hugging Face Hub" in push.value.error
    with daemon.http() as http:
        blob = http.head("/api/blobs/sha256:" + "0" * 64)
    assert blob.status_code == 501
