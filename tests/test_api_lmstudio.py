"""LM Studio's REST API (/api/v0) as Zed's LM Studio provider reads it, over a real socket.

Zed lists the models at /api/v0/models into a struct whose fields it requires (type, publisher,
compatibility_type, state: enums it spells out), keeps the non-embedding ones, sizes prompts by
`loaded_context_length` or else `max_context_length`, offers its agent where `capabilities` holds
`tool_use`, and chats at /api/v0/chat/completions with the body below; each streamed line must read
as its ResponseStreamEvent (created, model, object, choices of index, delta, finish_reason) or as
`{"error": {"message"}}`. The checks here are those of its deserializer (crates/lmstudio).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinymodels
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)

CTX = 1024
TYPES = {"llm", "embeddings", "vlm"}
STATES = {"loaded", "loading", "not-loaded"}
CITY = {"type": "string", "maxLength": 16}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_related_draft: Path) -> Iterator[Daemon]:
    models = tmp_path_factory.mktemp("lmstudio-models")
    tinymodels.write_tool_target(models / "tools.gguf")
    tinymodels.write_tiny_model(models / "plain.gguf", seed=5, name="plain")
    pins = json.dumps({"tools": "none", "plain": "none"})
    env = {"LOCALSPEC_MODELS": str(models), "LOCALSPEC_DRAFTS": pins}
    home = tmp_path_factory.mktemp("lmstudio-home")
    d = start_daemon(home, models / "tools.gguf", "--embed-model", str(tiny_related_draft), ctx=CTX, env=env)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.http() as client:
        yield client


def zed_entry(entry: dict[str, Any]) -> None:
    """What Zed's ModelEntry requires of one listed model."""
    assert isinstance(entry["id"], str) and isinstance(entry["object"], str)
    assert entry["type"] in TYPES and entry["state"] in STATES
    assert isinstance(entry["publisher"], str) and entry["compatibility_type"] in ("gguf", "mlx")
    for optional in ("arch", "quantization"):
        assert entry.get(optional) is None or isinstance(entry[optional], str)
    for optional in ("max_context_length", "loaded_context_length"):
        assert entry.get(optional) is None or isinstance(entry[optional], int)
    assert all(isinstance(c, str) for c in entry.get("capabilities", []))


def listed(http: httpx.Client) -> dict[str, dict[str, Any]]:
    response = http.get("/api/v0/models")
    assert response.status_code == 200, response.text
    entries = response.json()["data"]
    for entry in entries:
        zed_entry(entry)
    return {e["id"]: e for e in entries}


def zed_stream(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed chat, each read as Zed reads it: an event, or an error it raises."""
    events = []
    with http.stream("POST", "/api/v0/chat/completions", json=body) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            data = line.removeprefix("data: ")
            if data == line or data == "[DONE]":
                continue
            event = json.loads(data)
            assert "error" not in event, event
            assert isinstance(event["created"], int) and 0 <= event["created"] < 2**32
            assert isinstance(event["model"], str) and isinstance(event["object"], str)
            for choice in event["choices"]:
                assert isinstance(choice["index"], int) and isinstance(choice["delta"], dict)
                assert "finish_reason" in choice or choice.get("finish_reason") is None
                for call in choice["delta"].get("tool_calls") or ():
                    assert isinstance(call["index"], int)
            events.append(event)
    return events


def test_the_listing_says_what_each_model_is_and_what_is_loaded(http: httpx.Client) -> None:
    models = listed(http)
    tools, plain, embed = models["tools"], models["plain"], models["tiny-related-draft"]
    assert tools["type"] == plain["type"] == "llm" and embed["type"] == "embeddings"
    assert tools["capabilities"] == ["tool_use"] and plain["capabilities"] == []
    assert tools["state"] == "loaded" and tools["loaded_context_length"] == CTX
    # Every model is served at the daemon's context, loaded or not: that is the most a prompt may take.
    assert tools["max_context_length"] == plain["max_context_length"] == CTX
    assert tools["arch"] == "llama" and tools["compatibility_type"] == "gguf"
    assert tools["publisher"] == "local" and tools["quantization"]
    one = http.get("/api/v0/models/plain")
    assert one.status_code == 200 and one.json() == plain


def test_zeds_chat_streams_and_loads_the_model_it_names(http: httpx.Client) -> None:
    assert listed(http)["plain"]["state"] == "not-loaded"
    # Zed's body for a chat: max_tokens -1, an empty stop list, a temperature only where its user set
    # one (here one is, so the reply does not depend on the draw).
    body = {
        "model": "plain",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}],
        "stream": True,
        "max_tokens": -1,
        "stop": [],
        "temperature": 0,
    }
    events = zed_stream(http, {**body, "max_tokens": 12})
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert finish in (["length"], ["stop"]) and (text or finish == ["stop"])
    after = listed(http)["plain"]
    assert after["state"] == "loaded" and after["loaded_context_length"] == CTX


def test_zeds_tool_call_streams_as_deltas(http: httpx.Client) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather",
            # Closed, so the tiny model's random weights cannot ramble on past the city within max_tokens.
            "parameters": {
                "type": "object",
                "properties": {"city": CITY},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    body = {
        "model": "tools",
        "messages": [{"role": "user", "content": "what is the weather"}],
        "stream": True,
        "max_tokens": 160,
        "stop": [],
        "tools": [tool],
        "tool_choice": "required",
    }
    events = zed_stream(http, body)
    calls = [call for e in events for c in e["choices"] for call in c["delta"].get("tool_calls") or ()]
    names = "".join((call.get("function") or {}).get("name") or "" for call in calls)
    arguments = "".join((call.get("function") or {}).get("arguments") or "" for call in calls)
    assert names == "get_weather"
    assert isinstance(json.loads(arguments)["city"], str)


def test_errors_come_back_as_zed_reads_them(http: httpx.Client) -> None:
    missing = http.get("/api/v0/models/nope")
    assert missing.status_code == 404 and isinstance(missing.json()["error"]["message"], str)
    bad = http.post("/api/v0/chat/completions", json={"model": "tools", "messages": []})
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]


def test_embeddings_through_lmstudios_route(http: httpx.Client) -> None:
    response = http.post("/api/v0/embeddings", json={"model": "tiny-related-draft", "input": ["a", "b"]})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert len(data) == 2 and all(len(d["embedding"]) > 0 for d in data)
    assert listed(http)["tiny-related-draft"]["state"] == "loaded"
