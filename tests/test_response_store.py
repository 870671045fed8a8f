"""The Responses API's kept responses and conversations: bounded in count and size, least recently
used first."""

from __future__ import annotations

import pytest

from localspec.errors import UserInputError
from localspec.server.response_store import (
    ConversationStore,
    NotKeptError,
    PreviousNotFoundError,
    ResponseStore,
    StoredResponse,
    turns_size,
)
from localspec.server.responses_api import ResponsesFormat
from localspec.server.schemas_responses import ResponsesBody
from localspec.types import ChatMessage, GenerationResult, GenerationStats, ToolCall


def _kept(text: str) -> StoredResponse:
    turns = (ChatMessage("user", text), ChatMessage("assistant", "ok", (ToolCall("f", "{}", "call_1"),)))
    return StoredResponse(turns, (), {"id": text}, turns_size(turns))


def test_the_oldest_goes_first_and_a_read_makes_one_new() -> None:
    store = ResponseStore(max_responses=2)
    store.put("a", _kept("a"))
    store.put("b", _kept("b"))
    assert store.get("a").body == {"id": "a"}  # read: now the newest
    store.put("c", _kept("c"))
    assert store.find("b") is None and store.find("a") is not None and len(store) == 2


def test_the_size_bound_holds_but_the_newest_always_stays() -> None:
    size = _kept("x" * 100).size
    store = ResponseStore(max_bytes=size * 2)
    for name in "abc":
        store.put(name, _kept("x" * 100))
    assert len(store) == 2 and store.find("a") is None
    store.put("huge", _kept("x" * (size * 10)))  # past the bound alone: kept, the rest go
    assert len(store) == 1 and store.find("huge") is not None
    store.delete("huge")
    store.put("d", _kept("x" * 100))  # the bytes of what went are given back
    store.put("e", _kept("x" * 100))
    assert len(store) == 2


def test_ids_kept_nowhere_are_clear_errors() -> None:
    store = ResponseStore()
    with pytest.raises(NotKeptError) as caught:
        store.get("resp_x")
    assert caught.value.http_status == 404 and "store: false" in caught.value.message
    with pytest.raises(PreviousNotFoundError) as previous:
        store.previous("resp_x")
    assert previous.value.http_status == 400 and previous.value.param == "previous_response_id"
    with pytest.raises(NotKeptError):
        store.delete("resp_x")


def test_a_conversation_deleted_while_its_reply_was_written_leaves_the_reply_whole() -> None:
    responses, conversations = ResponseStore(), ConversationStore()
    conversation = conversations.create({}, [])
    body = ResponsesBody.model_validate({"model": "m", "input": "hi", "conversation": conversation.id})
    fmt = ResponsesFormat("m", body, responses, (ChatMessage("user", "hi"),), conversations)
    conversations.delete(conversation.id)
    result = GenerationResult("hello", (1,), "stop", GenerationStats(method="none"))
    whole = fmt.whole(result)
    assert whole["status"] == "completed" and whole["conversation"] == {"id": conversation.id}
    # Kept as a response all the same: it can be continued by its id.
    assert responses.get(whole["id"]).turns[-1] == ChatMessage("assistant", "hello")


def test_a_reply_in_a_conversation_adds_its_input_and_output_items() -> None:
    conversations = ConversationStore()
    conversation = conversations.create({"k": "v"}, [{"id": "msg_1", "type": "message", "role": "user"}])
    body = ResponsesBody.model_validate(
        {"model": "m", "input": "hi", "conversation": {"id": conversation.id}}
    )
    fmt = ResponsesFormat("m", body, None, (), conversations)
    whole = fmt.whole(GenerationResult("hello", (1,), "stop", GenerationStats(method="none")))
    items = conversations.items(conversation.id)
    assert [item["id"] for item in items] == ["msg_1", body.input_items[0]["id"], whole["output"][0]["id"]]
    assert whole["store"] is False


def test_items_past_the_bound_are_refused_and_the_conversation_kept_as_it_was() -> None:
    conversations = ConversationStore(max_bytes=2000)
    conversation = conversations.create({}, [])
    item = {"id": "msg_1", "type": "message", "role": "user", "content": "x" * 500}
    conversations.add(conversation.id, [item, {**item, "id": "msg_2"}])
    with pytest.raises(UserInputError) as full:
        conversations.add(conversation.id, [{**item, "id": f"msg_{i}"} for i in range(3, 6)])
    assert "start a new one" in full.value.message and full.value.param == "items"
    assert [i["id"] for i in conversations.items(conversation.id)] == ["msg_1", "msg_2"]
