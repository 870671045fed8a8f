"""OpenAI's Conversations API and Responses' `conversation`, through the real `openai` package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)

GREEDY: dict[str, Any] = {"model": "tiny-target", "max_output_tokens": 4, "temperature": 0}
HI = {**GREEDY, "input": "hi"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("conversations-home"), tiny_target)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai() as c:
        yield c


def _texts(client: openai.OpenAI, conversation: str) -> list[str]:
    """The conversation's items, oldest first, as their text (a call as its name)."""
    texts = []
    for item in client.conversations.items.list(conversation, order="asc"):
        data = item.model_dump()
        texts.append(data["content"][0]["text"] if data["type"] == "message" else data["name"])
    return texts


def test_a_conversation_is_created_read_changed_and_deleted(client: openai.OpenAI) -> None:
    made = client.conversations.create(
        items=[{"role": "user", "content": "hello"}], metadata={"topic": "demo"}
    )
    assert made.id.startswith("conv_") and made.metadata == {"topic": "demo"}
    assert client.conversations.retrieve(made.id).model_dump() == made.model_dump()
    assert client.conversations.update(made.id, metadata={"topic": "other"}).metadata == {"topic": "other"}
    assert _texts(client, made.id) == ["hello"]
    empty = client.conversations.create()  # nothing in it yet
    assert list(client.conversations.items.list(empty.id)) == []
    gone = client.conversations.delete(made.id)
    assert gone.deleted and gone.id == made.id and gone.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError) as caught:
        client.conversations.retrieve(made.id)
    assert made.id in str(caught.value)


def test_a_response_in_a_conversation_reads_its_items_and_adds_its_own(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[{"role": "user", "content": "hello"}])
    first = client.responses.create(conversation=conversation.id, input="world", **GREEDY)
    assert first.conversation is not None and first.conversation.id == conversation.id
    alone = client.responses.create(
        input=[{"role": "user", "content": "hello"}, {"role": "user", "content": "world"}],
        store=False,
        **GREEDY,
    )
    assert first.usage is not None and alone.usage is not None
    assert first.usage.input_tokens == alone.usage.input_tokens and first.output_text == alone.output_text
    # Its input and its output went in, the output items with the ids the response gave them.
    listed = list(client.conversations.items.list(conversation.id, order="asc"))
    assert _texts(client, conversation.id) == ["hello", "world", first.output_text]
    assert listed[-1].id == first.output[0].id
    # The next turn reads all of it: the same prompt as the whole conversation sent again.
    sent_back: list[Any] = [item.model_dump() for item in first.output]
    then = client.responses.create(conversation={"id": conversation.id}, input="again", **GREEDY)
    whole = client.responses.create(
        input=[
            {"role": "user", "content": "hello"},
            {"role": "user", "content": "world"},
            *sent_back,
            {"role": "user", "content": "again"},
        ],
        store=False,
        **GREEDY,
    )
    assert then.usage is not None and whole.usage is not None
    assert then.usage.input_tokens == whole.usage.input_tokens


def test_items_are_added_read_paged_and_deleted(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=[{"role": "user", "content": "one"}])
    items: Any = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "three"}]},
    ]
    added = client.conversations.items.create(conversation.id, items=items)
    assert [item.model_dump()["content"][0]["text"] for item in added.data] == ["two", "three"]
    two = added.data[0].id
    assert two is not None
    assert client.conversations.items.retrieve(two, conversation_id=conversation.id).id == two
    # Newest first by default; one at a time, the SDK following `after`.
    newest = client.conversations.items.list(conversation.id)
    assert [item.model_dump()["content"][0]["text"] for item in newest.data] == ["three", "two", "one"]
    paged = client.conversations.items.list(conversation.id, limit=1)
    assert len(paged.data) == 1 and paged.has_more
    assert [item.id for item in paged] == [item.id for item in newest.data]
    after = client.conversations.items.delete(two, conversation_id=conversation.id)
    assert after.id == conversation.id and _texts(client, conversation.id) == ["one", "three"]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(two, conversation_id=conversation.id)


@pytest.mark.parametrize(
    ("path", "body", "status", "words", "param"),
    [
        ("/v1/responses", {**HI, "conversation": "conv_nope"}, 404, "conv_nope", "conversation"),
        ("/v1/responses", {**HI, "conversation": {"name": "x"}}, 400, "an id", "conversation"),
        (
            "/v1/responses",
            {**HI, "conversation": "conv_x", "previous_response_id": "resp_x"},
            400,
            "send one",
            "conversation",
        ),
        (
            "/v1/conversations",
            {"items": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            400,
            "vision",
            "items.0.content",
        ),
        ("/v1/conversations", {"items": [{"type": "web_search_call"}]}, 400, "not supported", "items.0"),
        ("/v1/conversations", {"items": [{"role": "user", "content": "x"}] * 21}, 400, "at most 20", "items"),
        ("/v1/conversations", {"metadata": {"k": "v" * 513}}, 400, "at most 512", "metadata"),
        ("/v1/conversations", {"metadata": {"k": 1}}, 400, "string", "metadata.k"),
    ],
)  # fmt: skip
def test_what_cannot_be_kept_is_a_clear_error(
    daemon: Daemon, path: str, body: dict[str, Any], status: int, words: str, param: str
) -> None:
    with daemon.http() as http:
        response = http.post(path, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert words in error["message"] and error["param"] == param, error
        assert http.get("/conversations/conv_nope/items").status_code == 404  # the bare path too
