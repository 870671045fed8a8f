"""llama-server's /infill, driven with the exact bytes llama.vim sends, against a real daemon process.

The tiny target here has FIM tokens and Qwen2.5-Coder's repository tokens
(`<|repo_name|>`, `<|file_sep|>`), so other files' context is laid out for real.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tinymodels
from daemonproc import Daemon, start_daemon

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.llama import LlamaModel
from localspec.engine.prompting import prompt_tokens
from localspec.engine.worker import Engine
from localspec.types import FileChunk, GenerationRequest, SamplingParams

pytestmark = pytest.mark.timeout(120)

REPO_TOKENS = ("<|repo_name|>", "<|file_sep|>")
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
# llama.vim's fast check on an answer, before it decodes it (autoload/llama.vim, s:fim_on_response).
LLAMA_VIM_ACCEPTS = re.compile(rb"^\s*{"), re.compile(rb'"content"\s*:"')
LLAMA_VIM_FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]
EXTRA = [{"text": "the model is a cat\nthe cat is\n", "time": [1732390000, 421337], "filename": "notes.txt"}]


def vim_json(data: dict[str, Any]) -> bytes:
    """What Vim's json_encode() writes: no spaces at all, non-ASCII as is."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def llama_vim_fim(prefix: str, middle: str, suffix: str) -> bytes:
    """The body of llama#fim() (llama.vim's main completion request), defaults as it ships."""
    return vim_json(
        {
            "id_slot": 0,
            "input_prefix": prefix,
            "input_suffix": suffix,
            "input_extra": EXTRA,
            "prompt": middle,
            "n_predict": 128,
            "stop": [],
            "n_indent": 4,
            "top_k": 40,
            "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"],
            "stream": False,
            "cache_prompt": True,
            "t_max_prompt_ms": 500,
            "t_max_predict_ms": 250,
            "response_fields": LLAMA_VIM_FIELDS,
        }
    )


def llama_vim_warmup(fields: list[str] | None = None) -> bytes:
    """The body of s:ring_update(): only the other files, to fill the cache (n_predict 0)."""
    body: dict[str, Any] = {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": EXTRA,
        "prompt": "",
        "n_predict": 0,
        "temperature": 0.0,
        "samplers": [],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1,
    }
    if fields is not None:
        body["response_fields"] = fields
    return vim_json(body)


def curl_post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """POST as `curl --silent --no-buffer --request POST --header 'Content-Type: ...' --data @-` does."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head + body)
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += sock.recv(65536)
        header, _, rest = raw.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", header).group(1))  # type: ignore[union-attr]
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(header.split(b" ")[1]), rest


@pytest.fixture(scope="module")
def repo_target(tiny_dir: Path) -> Path:
    extra = (tinymodels.IM_START, tinymodels.IM_END, *FIM_TOKENS, *REPO_TOKENS)
    vocab = tinymodels.build_vocab(extra_tokens=extra)
    return tinymodels.write_tiny_model(tiny_dir / "tiny-repo-fim.gguf", vocab=vocab, name="tiny-repo-fim")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, repo_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("infill-home"), repo_target, tcp=True, ctx=1024)
    yield d
    assert d.stop() == 0, d.log()


def test_llama_vim_request_gets_an_answer_llama_vim_accepts(daemon: Daemon) -> None:
    assert daemon.port is not None
    status, raw = curl_post(daemon.port, "/infill", llama_vim_fim("the cat\n", "the model ", "\nis a\n"))
    assert status == 200, raw
    assert all(p.search(raw) for p in LLAMA_VIM_ACCEPTS), raw
    body = json.loads(raw)
    # Only the fields asked for, nested ones flattened under their path, as llama-server answers.
    assert set(body) == set(LLAMA_VIM_FIELDS)
    assert isinstance(body["content"], str)
    assert body["timings/predicted_n"] <= 128
    assert body["timings/prompt_n"] > 0 and body["tokens_cached"] >= body["timings/prompt_n"]


def test_warmup_fills_the_cache_for_the_next_completion(daemon: Daemon) -> None:
    assert daemon.port is not None
    status, raw = curl_post(daemon.port, "/infill", llama_vim_warmup([""]))
    assert (status, json.loads(raw)) == (200, {})  # llama-server's answer to response_fields [""]
    again = json.loads(curl_post(daemon.port, "/infill", llama_vim_warmup())[1])
    assert (again["content"], again["tokens_predicted"], again["stop_type"]) == ("", 0, "limit")
    evaluated = again["tokens_evaluated"]
    # All but the last prompt token (always read again) came from the first warm-up's cache.
    assert again["localspec"]["cached_tokens"] == evaluated - 1
    with daemon.tcp_http() as http:
        body = {"input_extra": EXTRA, "input_prefix": "the cat\n", "prompt": "is", "n_predict": 4}
        done = http.post("/infill", json=body).json()
    # The files and the FIM prefix token are shared; the warm-up's suffix and middle tokens are not.
    assert done["localspec"]["cached_tokens"] == evaluated - 2
    assert done["generation_settings"]["n_ctx"] == 1024


def test_greedy_infill_equals_the_engine_and_streams_the_same(daemon: Daemon, repo_target: Path) -> None:
    body = {"input_prefix": "the cat\n", "prompt": "the model ", "input_suffix": "\nis a\n",
            "input_extra": EXTRA, "n_predict": 24, "temperature": 0}  # fmt: skip
    request = GenerationRequest(
        prompt="the cat\nthe model ",
        suffix="\nis a\n",
        extra=(FileChunk("notes.txt", EXTRA[0]["text"]),),  # type: ignore[arg-type]
        max_tokens=24,
        sampling=SamplingParams(temperature=0.0),
    )
    with Engine(EngineConfig(target=repo_target, load=LoadOptions(n_ctx=1024, n_threads=1))) as engine:
        expected = engine.generate(request).text
    with daemon.http() as http:
        whole = http.post("/infill", json=body).json()
        with http.stream("POST", "/infill", json={**body, "stream": True}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert whole["content"] == expected and whole["stop"] is True
    assert "".join(f["content"] for f in frames) == expected
    assert [f["stop"] for f in frames].count(True) == 1 and frames[-1]["stop"]
    assert frames[-1]["timings"]["predicted_n"] == whole["tokens_predicted"]


def test_bad_infill_requests_are_clear_400s(daemon: Daemon) -> None:
    with daemon.http() as http:
        many = http.post("/infill", json={"input_prefix": "x", "n_cmpl": 2})
        sampler = http.post("/infill", json={"input_prefix": "x", "samplers": ["mirostat_v9"]})
        chunk = http.post("/infill", json={"input_extra": [{"filename": "a.py"}]})
    assert many.status_code == 400 and "n_cmpl" in many.json()["error"]["message"]
    assert sampler.status_code == 400 and "mirostat_v9" in sampler.json()["error"]["message"]
    assert chunk.status_code == 400 and "input_extra.0.text" in chunk.json()["error"]["message"]


def _rendered(model: LlamaModel, tokens: list[int]) -> str:
    specials = {*model.fim_tokens(), *model.fim_repo_tokens()}  # type: ignore[misc]
    return "".join(
        model.token_text(t) if t in specials else model.piece(t).decode(errors="replace") for t in tokens
    )


def test_other_files_are_laid_out_as_qwen_repository_context(repo_target: Path) -> None:
    model = LlamaModel(repo_target, LoadOptions(n_ctx=256, n_threads=1))
    try:
        files = (FileChunk("a.txt", "the cat\n"), FileChunk("b.txt", "a dog\n"))
        request = GenerationRequest(prompt="is ", suffix=" the", extra=files, max_tokens=8)
        # The tiny model's SentencePiece tokenizer puts a space before each text it encodes.
        assert _rendered(model, prompt_tokens(model, request)) == (
            "<|repo_name|> myproject\n<|file_sep|> a.txt\n the cat\n<|file_sep|> b.txt\n a dog\n"
            "<|file_sep|> filename\n<|fim_prefix|> is <|fim_suffix|>  the<|fim_middle|>"
        )
        # Past the context, the oldest files' tokens go first; the FIM prompt itself is whole.
        long = (FileChunk("old.txt", "the cat is " * 200), FileChunk("new.txt", "a dog\n"))
        tokens = prompt_tokens(
            model, GenerationRequest(prompt="is ", suffix=" the", extra=long, max_tokens=8)
        )
        text = _rendered(model, tokens)
        assert len(tokens) == 256 - 8 and text.endswith(
            "<|file_sep|> new.txt\n a dog\n<|file_sep|> filename\n"
            "<|fim_prefix|> is <|fim_suffix|>  the<|fim_middle|>"
        )
        assert "<|repo_name|>" not in text
    finally:
        model.close()


def test_infill_without_fim_tokens_is_refused(tmp_path: Path, tiny_target: Path) -> None:
    d = start_daemon(tmp_path / "home", tiny_target, ctx=512)
    try:
        with d.http() as http:
            response = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
        assert response.status_code == 400
        assert "no fill-in-the-middle tokens" in response.json()["error"]["message"]
    finally:
        assert d.stop() == 0, d.log()


def test_native_completion_equals_openai_completions(daemon: Daemon) -> None:
    """llama-server's /completion (Continue's llama.cpp provider): a raw prompt, llama-server's answer."""
    native = {"prompt": "the cat is", "n_predict": 10, "temperature": 0, "stop": ["never"]}
    oai = {"model": "tiny-repo-fim", "prompt": "the cat is", "max_tokens": 10, "temperature": 0}
    with daemon.http() as http:
        whole = http.post("/completion", json=native).json()
        with http.stream("POST", "/completion", json={**native, "stream": True}) as response:
            frames = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
        expected = http.post("/v1/completions", json=oai).json()["choices"][0]["text"]
        probe = http.get("/")
    assert whole["content"] == expected and whole["tokens_predicted"] == 10 and whole["stop_type"] == "limit"
    assert "".join(f["content"] for f in frames) == expected and frames[-1]["stop"] is True
    assert probe.status_code == 200 and "localspec is running" in probe.text
