"""Every refusal the API makes, with its status and shape: bad input, unknown models, limits, and the guards.

Host, Origin and token checks run against the real daemon over both transports,
with raw httpx so the headers are exactly the ones under test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemonproc import TOKEN, Daemon, metric, start_daemon

pytestmark = pytest.mark.timeout(120)

CHAT_PATH = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello"}]
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("errors-home")
    d = start_daemon(home, tiny_target, "--max-body", str(LIMIT), tcp=True, token=TOKEN, ctx=256)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.http() as client:
        yield client


def _openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


LONE_SURROGATE = b'{"model": "tiny-target", "messages": [{"role": "user", "content": "\\ud800"}]}'


@pytest.mark.parametrize(
    "body", [b"{", b"not json", b"", b"[1, 2]", b'"a string"', b"[" * 50_000, LONE_SURROGATE]
)
def test_malformed_json_is_400(http: httpx.Client, body: bytes) -> None:
    error = _openai_error(http.post(CHAT_PATH, content=body), 400)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 17}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"speculative": {"method": "magic"}}, "speculative.method"),
        ({"speculative": {"k": 0}}, "speculative.k"),
        ({"model": ""}, "model"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
        # The tiny target's template renders no tools: a clear refusal, not a silent drop.
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
    ],
)
def test_bad_parameters_are_400_naming_the_param(
    http: httpx.Client, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "tiny-target", "messages": MESSAGES, "max_tokens": 2, **extra}
    assert _openai_error(http.post(CHAT_PATH, json=body), 400)["param"] == param


def test_unknown_model_is_404_and_never_a_path(http: httpx.Client) -> None:
    for name in ("gpt-4", "../tiny-target", "/etc/passwd", "tiny-target.gguf/..", "tiny-target:7b"):
        body = {"model": name, "messages": MESSAGES, "max_tokens": 2}
        error = _openai_error(http.post(CHAT_PATH, json=body), 404)
        assert error["code"] == "model_not_found"
    ollama = http.post("/api/show", json={"model": "../../secret"})
    assert ollama.status_code == 404 and isinstance(ollama.json()["error"], str)


def test_the_file_name_and_the_alias_are_accepted(http: httpx.Client) -> None:
    for name in ("tiny-target", "tiny-target.gguf", "localspec", "localspec:latest"):
        body = {"model": name, "messages": MESSAGES, "max_tokens": 1}
        assert http.post(CHAT_PATH, json=body).status_code == 200


def test_a_body_over_the_limit_is_413(http: httpx.Client) -> None:
    big = {"model": "tiny-target", "messages": [{"role": "user", "content": "x" * LIMIT}]}
    error = _openai_error(http.post(CHAT_PATH, json=big), 413)
    assert error["code"] == "body_too_large"


def test_a_chunked_body_over_the_limit_is_413(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "tiny-target", "messages": [{"role": "user", "content": "'
        for _ in range(LIMIT // 1024 + 1):
            yield b"y" * 1024
        yield b'"}]}'

    # A generator body goes out with Transfer-Encoding: chunked, without Content-Length.
    assert _openai_error(http.post(CHAT_PATH, content=chunks()), 413)["code"] == "body_too_large"
    ollama = http.post("/api/chat", content=chunks())
    assert ollama.status_code == 413 and isinstance(ollama.json()["error"], str)


def test_context_overflow_is_400_with_both_counts(http: httpx.Client) -> None:
    long = " ".join(["hello world"] * 300)
    body = {"model": "tiny-target", "messages": [{"role": "user", "content": long}], "stream": True}
    error = _openai_error(http.post(CHAT_PATH, json=body), 400)  # before the stream starts: a real status
    assert error["code"] == "context_length_exceeded"
    # In OpenAI's words (LiteLLM and the agents on it look for them), and Anthropic's (agents on
    # its API recognise a full context by them).
    openai_words = (
        r"^This model's maximum context length is (\d+) tokens\. However, your prompt resulted in (\d+)"
    )
    n_ctx, n_prompt = map(int, re.findall(openai_words, error["message"])[0])
    assert n_prompt > n_ctx == 256 and "--ctx" in error["message"]
    messages = {"model": "tiny-target", "max_tokens": 8, "messages": [{"role": "user", "content": long}]}
    anthropic = http.post("/v1/messages", json=messages)
    assert anthropic.status_code == 400 and anthropic.json()["error"]["type"] == "invalid_request_error"
    found = re.findall(
        r"^prompt is too long: (\d+) tokens > (\d+) maximum", anthropic.json()["error"]["message"]
    )
    assert found and int(found[0][0]) > int(found[0][1]) == 256
    # Ollama's `truncate: false` (on, the prompt loses its middle, as Ollama's runner cuts it).
    body = {"model": "tiny-target", "prompt": long, "stream": False, "truncate": False}
    ollama = http.post("/api/generate", json=body)
    assert ollama.status_code == 400 and "256" in ollama.json()["error"]


def test_suffix_on_a_model_without_fim_tokens_is_400(http: httpx.Client) -> None:
    body = {"model": "tiny-target", "prompt": "def f(", "suffix": "return x", "max_tokens": 4}
    assert _openai_error(http.post("/v1/completions", json=body), 400)["param"] == "suffix"


def test_unknown_routes_and_methods(http: httpx.Client) -> None:
    assert _openai_error(http.get("/v1/nothing"), 404)["code"] == "not_found"
    assert _openai_error(http.get(CHAT_PATH), 405)["code"] == "method_not_allowed"
    assert isinstance(http.get("/api/nothing").json()["error"], str)


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil"]
)
def test_foreign_host_is_403_on_both_transports(daemon: Daemon, host: str) -> None:
    with daemon.http() as uds:
        _openai_error(uds.get("/v1/models", headers={"Host": host}), 403)
    with daemon.tcp_http(token=TOKEN) as tcp:
        # A valid token proves the caller is no rebinding web page, so it may use any name.
        assert tcp.get("/v1/models", headers={"Host": host}).status_code == 200
    with daemon.tcp_http() as tcp:
        assert tcp.get("/v1/models", headers={"Host": host}).status_code in (401, 403)


@pytest.mark.parametrize("host", ["localhost", "localhost:8977", "127.0.0.1:1", "[::1]:8977", "LOCALHOST"])
def test_loopback_hosts_pass(http: httpx.Client, host: str) -> None:
    assert http.get("/v1/models", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "null", "http://localhost.evil.example", "file://"]
)
def test_foreign_origin_is_403(daemon: Daemon, origin: str) -> None:
    with daemon.http() as uds:
        error = _openai_error(uds.post(CHAT_PATH, json={}, headers={"Origin": origin}), 403)
        assert error["type"] == "permission_error"
    with daemon.tcp_http(token=TOKEN) as tcp:
        _openai_error(tcp.get("/health", headers={"Origin": origin}), 403)


def test_loopback_origin_passes(http: httpx.Client) -> None:
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:5173"):
        assert http.get("/v1/models", headers={"Origin": origin}).status_code == 200


def test_tcp_token_is_required_and_compared(daemon: Daemon) -> None:
    with daemon.tcp_http() as tcp:
        error = _openai_error(tcp.get("/v1/models"), 401)
        assert error["type"] == "authentication_error"
        assert tcp.get("/health", headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 401
        assert tcp.get("/health", headers={"Authorization": TOKEN}).status_code == 401
        assert tcp.get("/api/tags").status_code == 401
    with daemon.tcp_http(token=TOKEN) as tcp:
        assert tcp.get("/v1/models").status_code == 200


def test_openapi_schema_describes_the_routes(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    for path in ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate", "/health"):
        assert path in schema["paths"]
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith("ChatCompletionBody")
    assert "SpeculativeOptions" in schema["components"]["schemas"]


def test_metrics_count_requests_tokens_and_speculation(http: httpx.Client) -> None:
    body = {"model": "tiny-target", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    assert http.post(CHAT_PATH, json=body | {"speculative": {"method": "ngram"}}).status_code == 200
    text = http.get("/metrics").text
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? [0-9.e+-]+", line), line
    assert metric(text, 'localspec_requests_total{route="/v1/chat/completions",status="200"}') >= 1
    assert metric(text, "localspec_generated_tokens_total") >= 1
    assert metric(text, "localspec_ttft_seconds_count") >= 1
    assert metric(text, 'localspec_ttft_seconds_bucket{le="+Inf"}') == metric(
        text, "localspec_ttft_seconds_count"
    )
    assert "localspec_drafted_tokens_total" in text and "localspec_accepted_tokens_total" in text
    assert "localspec_queue_depth 0" in text
    assert metric(text, "localspec_up") == 1


def test_the_daemon_survives_all_of_the_above(http: httpx.Client) -> None:
    assert http.get("/health").json()["status"] == "ready"
    assert json.loads(http.get("/api/version").text)["version"]
