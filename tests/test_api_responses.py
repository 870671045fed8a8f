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
        ({"background": True}, "background"),
        ({"previous_response_id": "resp_123"}, "no response with id 'resp_123' is kept"),
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


# --- kept responses: previous_response_id, retrieve, input_items, delete ----------------------


def test_a_continued_response_reads_as_the_whole_conversation_sent_again(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny-target", "instructions": "be brief", "max_output_tokens": 6,
                          "temperature": 0}  # fmt: skip
    first = client.responses.create(input="hello", **kw)
    assert first.store is True and first.previous_response_id is None
    then = client.responses.create(previous_response_id=first.id, input="world", **kw)
    assert then.previous_response_id == first.id
    # The same conversation sent whole, the first reply's output items sent back as a client does.
    sent_back: list[Any] = [item.model_dump() for item in first.output]
    whole = client.responses.create(
        input=[{"role": "user", "content": "hello"}, *sent_back, {"role": "user", "content": "world"}],
        store=False,
        **kw,
    )
    assert then.usage is not None and whole.usage is not None
    assert then.usage.input_tokens == whole.usage.input_tokens and then.output_text == whole.output_text
    assert whole.store is False
    # The instructions are this request's alone (OpenAI carries none over): none, a shorter prompt.
    bare = client.responses.create(
        **{**kw, "instructions": None}, previous_response_id=first.id, input="world"
    )
    assert bare.usage is not None and bare.usage.input_tokens < then.usage.input_tokens


def test_a_kept_response_is_read_back_deleted_and_then_gone(client: openai.OpenAI) -> None:
    out = client.responses.create(model="tiny-target", input="hello", max_output_tokens=4, temperature=0)
    again = client.responses.retrieve(out.id)
    assert again.model_dump() == out.model_dump()
    # A streamed one is kept too, as its response.completed (or incomplete) event had it.
    events = list(
        client.responses.create(
            model="tiny-target", input="hi", max_output_tokens=4, temperature=0, stream=True
        )
    )
    last = events[-1].response  # type: ignore[union-attr]
    assert client.responses.retrieve(last.id).model_dump() == last.model_dump()
    client.responses.delete(out.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.retrieve(out.id)
    assert out.id in str(gone.value) and "store: false" in str(gone.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(out.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny-target", previous_response_id=out.id, input="more")
    assert (
        refused.value.param == "previous_response_id" and refused.value.code == "previous_response_not_found"
    )
    # store: false keeps nothing.
    unkept = client.responses.create(
        model="tiny-target", input="hello", max_output_tokens=2, temperature=0, store=False
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_input_items_page_as_openais(client: openai.OpenAI) -> None:
    items: list[Any] = [
        {"role": "user", "content": "one"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "three"}]},
    ]
    out = client.responses.create(model="tiny-target", input=items, max_output_tokens=2, temperature=0)
    newest_first = client.responses.input_items.list(out.id)
    texts = [item.model_dump()["content"][0]["text"] for item in newest_first.data]
    assert texts == ["three", "two", "one"] and not newest_first.has_more
    assert len({item.id for item in newest_first.data}) == 3
    # One at a time, oldest first: the SDK follows `after` while has_more.
    paged = client.responses.input_items.list(out.id, order="asc", limit=1)
    assert len(paged.data) == 1 and paged.has_more
    assert [item.id for item in paged] == [item.id for item in reversed(newest_first.data)]
    # A text input is one user message.
    text = client.responses.create(model="tiny-target", input="hello", max_output_tokens=2, temperature=0)
    (only,) = client.responses.input_items.list(text.id).data
    listed = only.model_dump()
    assert (
        listed["type"] == "message" and listed["role"] == "user" and listed["content"][0]["text"] == "hello"
    )


@pytest.mark.parametrize(
    ("query", "words", "param"),
    [
        ("?limit=0", "limit must be", "limit"),
        ("?limit=lots", "limit must be", "limit"),
        ("?order=sideways", "asc or desc", "order"),
        ("?after=msg_nope", "no item 'msg_nope'", "after"),
    ],
)
def test_input_items_queries_that_cannot_be_read_are_400s(
    daemon: Daemon, query: str, words: str, param: str
) -> None:
    body = {"model": "tiny-target", "input": "hi", "max_output_tokens": 2, "temperature": 0}
    with daemon.http() as http:
        kept = http.post("/v1/responses", json=body).json()["id"]
        response = http.get(f"/v1/responses/{kept}/input_items{query}")
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert words in error["message"] and error["param"] == param
        streamed = http.get(f"/responses/{kept}?stream=true")  # replays are for background responses
        assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
        assert http.get(f"/responses/{kept}").json()["id"] == kept  # the bare path, as llama-server's
