"""OpenAI's Responses API, driven by the real `openai` package's `responses.create` against a real daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("responses-home"), tiny_target)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai() as c:
        yield c


def _chat(daemon: Daemon, messages: list[dict[str, str]], max_tokens: int) -> Any:
    body = {"model": "tiny-target", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    with daemon.http() as http:
        return http.post("/v1/chat/completions", json=body).json()


def test_create_equals_chat_of_the_same_conversation(client: openai.OpenAI, daemon: Daemon) -> None:
    out = client.responses.create(
        model="tiny-target",
        instructions="be brief",
        input=[
            {"role": "user", "content": "hello"},
            # An earlier answer sent back as Codex does: a message item with output_text.
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "the cat"}]},  # type: ignore[misc, list-item]
            {"role": "user", "content": [{"type": "input_text", "text": "world"}]},
        ],
        max_output_tokens=16,
        temperature=0,
    )
    chat = _chat(
        daemon,
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"},
         {"role": "assistant", "content": "the cat"}, {"role": "user", "content": "world"}],
        16,
    )  # fmt: skip
    assert out.object == "response" and out.id.startswith("resp_")
    assert out.output_text == chat["choices"][0]["message"]["content"]
    assert out.usage is not None and out.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert out.usage.input_tokens == chat["usage"]["prompt_tokens"]
    limited = chat["choices"][0]["finish_reason"] == "length"
    assert out.status == ("incomplete" if limited else "completed")
    if limited:
        assert out.incomplete_details is not None and out.incomplete_details.reason == "max_output_tokens"


def test_stream_event_sequence(client: openai.OpenAI) -> None:
    whole = client.responses.create(
        model="tiny-target", input="hello world", max_output_tokens=12, temperature=0
    )
    events = list(client.responses.create(model="tiny-target", input="hello world", max_output_tokens=12,
                                          temperature=0, stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    n = kinds.count("response.output_text.delta")
    end = "response.incomplete" if whole.status == "incomplete" else "response.completed"
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * n,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     end]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert n >= 1 and deltas == whole.output_text
    last = events[-1].response  # type: ignore[union-attr]
    assert last.output_text == whole.output_text and last.status == whole.status


def test_unlimited_response_completes(client: openai.OpenAI) -> None:
    out = client.responses.create(model="tiny-target", input="hi", temperature=0)
    assert out.status in ("completed", "incomplete") and out.output_text is not None


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"store": True}, "stateless"),
        ({"previous_response_id": "resp_123"}, "stateless"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "'file_search' tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            "vision",
        ),
        ({"text": {"format": {"type": "grammar"}}}, "text.format"),
    ],
)
def test_unsupported_is_a_clear_400(daemon: Daemon, extra: dict[str, Any], words: str) -> None:
    body = {"model": "tiny-target", "input": "hi", "max_output_tokens": 4, **extra}
    with daemon.http() as http:
        response = http.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]


def test_store_false_and_reasoning_items_are_fine(daemon: Daemon) -> None:
    items = [{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "user", "content": "hi"}]
    body = {"model": "tiny-target", "store": False, "max_output_tokens": 3, "temperature": 0, "input": items}
    with daemon.http() as http:
        response = http.post("/responses", content=json.dumps(body))
    assert response.status_code == 200 and response.json()["output"][0]["content"][0]["type"] == "output_text"


def test_truncation_auto_drops_the_oldest_input_items_to_fit(client: openai.OpenAI) -> None:
    """OpenAI's `truncation`: auto leaves out the conversation's oldest items; disabled (the default)
    refuses an input past the context, in OpenAI's words."""
    turn = " ".join(["hello world"] * 60)
    items: list[Any] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {turn}"} for i in range(41)
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny-target", input=items, max_output_tokens=4)
    assert "maximum context length is 2048 tokens" in str(refused.value)
    out = client.responses.create(
        model="tiny-target", instructions="be brief", input=items, max_output_tokens=4, truncation="auto"
    )
    assert out.truncation == "auto" and out.usage is not None
    assert 2048 // 2 < out.usage.input_tokens <= 2048 - 4
    assert (out.model_extra or {})["localspec"]["dropped_messages"] > 0
