"""How far a prompt's read has got, streamed before the first token (llama-server's return_progress).

The engine on the tiny target (chunks of 32 tokens: a few hundred tokens are many of them), then
a real daemon over its socket: the openai package on chat and text completions, and the bytes of
llama-server's own /completion as llama.cpp's web UI reads them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from daemonproc import Daemon, start_daemon
from openai import OpenAI
from test_engine import TINY, make_engine

from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, PromptProgress, TokenChunk

pytestmark = pytest.mark.timeout(120)

BATCH = 32
TEXT = " ".join(f"line {i} of the file" for i in range(80))  # a few hundred tokens


@pytest.fixture(scope="module")
def engine(tiny_target: Path) -> Iterator[Engine]:
    with make_engine(tiny_target, load=replace(TINY, n_batch=BATCH)) as e:
        yield e


def streamed(engine: Engine, request: GenerationRequest) -> tuple[list[PromptProgress], list[TokenChunk]]:
    """The request's progress reports, and its other chunks, in order; each report came before them."""
    reports: list[PromptProgress] = []
    chunks: list[TokenChunk] = []
    for chunk in engine.submit(request):
        if chunk.progress is not None:
            assert not chunks and not chunk.text and not chunk.token_ids
            reports.append(chunk.progress)
        else:
            chunks.append(chunk)
    return reports, chunks


def test_the_read_is_reported_as_it_begins_between_its_chunks_and_once_it_is_done(engine: Engine) -> None:
    request = GenerationRequest(prompt=TEXT, max_tokens=4, progress=True, cache_prompt=False)
    reports, chunks = streamed(engine, request)
    total = reports[0].total
    assert total > 8 * BATCH and chunks
    assert [r.processed for r in reports] == [*range(0, total, BATCH), total]
    assert all(r.total == total and r.cached == 0 for r in reports)
    seconds = [r.seconds for r in reports]
    assert seconds == sorted(seconds) and seconds[-1] > 0


def test_a_cached_prefix_is_reported_as_read_from_the_start(engine: Engine) -> None:
    first = GenerationRequest(prompt=TEXT, max_tokens=4, progress=True)
    engine.generate(first)
    reports, _ = streamed(engine, replace(first, prompt=TEXT + " and one more line of it"))
    assert reports[0].cached > 8 * BATCH and reports[0].processed == reports[0].cached
    assert reports[-1].processed == reports[-1].total > reports[0].cached


def test_nothing_is_reported_unasked_or_unstreamed(engine: Engine) -> None:
    reports, chunks = streamed(engine, GenerationRequest(prompt=TEXT, max_tokens=4, cache_prompt=False))
    assert not reports and chunks
    result = engine.generate(GenerationRequest(prompt=TEXT, max_tokens=4, progress=True, cache_prompt=False))
    assert result.stats.tokens == 4  # run whole, nothing streamed: no reports to skip


# --- the daemon -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("progress-home"), tiny_target, ctx=8192)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[OpenAI]:
    with daemon.openai() as c:
        yield c


LONG = "the model is " * 1500  # about 4,500 tokens: nine of the daemon's 512-token chunks


def check_reports(reports: list[dict[str, Any]]) -> None:
    assert len(reports) >= 9, reports
    total = reports[0]["total"]
    assert reports[0]["processed"] == reports[0]["cache"] and reports[-1]["processed"] == total
    processed = [r["processed"] for r in reports]
    assert processed == sorted(processed) and all(r["total"] == total for r in reports)
    assert all(isinstance(r["time_ms"], float | int) for r in reports)


def test_openai_chat_streams_prompt_progress_and_the_same_reply(client: OpenAI) -> None:
    ask: dict[str, Any] = {
        "model": "tiny-target",
        "messages": [{"role": "user", "content": "progress " + LONG}],
        "max_tokens": 8,
        "temperature": 0,
    }
    plain = client.chat.completions.create(**ask, extra_body={"cache_prompt": False})
    reports: list[dict[str, Any]] = []
    parts: list[str] = []
    roles: list[str] = []
    stream = client.chat.completions.create(
        **ask, stream=True, extra_body={"return_progress": True, "cache_prompt": False}
    )
    for chunk in stream:
        extra = chunk.model_extra or {}
        if "prompt_progress" in extra:
            assert not parts and not chunk.choices[0].delta.content
            reports.append(extra["prompt_progress"])
        if chunk.choices and chunk.choices[0].delta.role:
            roles.append(chunk.choices[0].delta.role)
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    check_reports(reports)
    assert roles == ["assistant"]  # once: the SDK's accumulating helpers join repeated strings
    assert "".join(parts) == plain.choices[0].message.content


def test_openai_completions_stream_prompt_progress_only_when_asked(client: OpenAI) -> None:
    ask: dict[str, Any] = {"model": "tiny-target", "prompt": "completion " + LONG, "max_tokens": 4}

    def reports(extra_body: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for chunk in client.completions.create(**ask, stream=True, extra_body=extra_body):
            if "prompt_progress" in (chunk.model_extra or {}):
                assert chunk.choices[0].text == ""
                out.append((chunk.model_extra or {})["prompt_progress"])
        return out

    check_reports(reports({"return_progress": True, "cache_prompt": False}))
    assert reports({"cache_prompt": False}) == []
    whole = client.completions.create(**ask, extra_body={"return_progress": True, "cache_prompt": False})
    assert "prompt_progress" not in (whole.model_extra or {})  # not streamed: one body, as llama-server


def test_llama_server_completion_streams_prompt_progress(daemon: Daemon) -> None:
    """llama-server's /completion frames, as llama.cpp's web UI reads them: `prompt_progress` on
    frames with empty content, then the tokens."""
    body = {"prompt": "native " + LONG, "n_predict": 4, "stream": True, "return_progress": True}
    frames: list[dict[str, Any]] = []
    with daemon.http() as http, http.stream("POST", "/completion", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                frames.append(json.loads(line[6:]))
    progress = [f for f in frames if "prompt_progress" in f]
    check_reports([f["prompt_progress"] for f in progress])
    assert all(f["content"] == "" and f["tokens"] == [] and f["stop"] is False for f in progress)
    assert all(f["tokens_evaluated"] == f["prompt_progress"]["total"] for f in progress)
    assert frames.index(progress[-1]) < min(i for i, f in enumerate(frames) if f["content"])
    assert frames[-1]["stop"] is True
