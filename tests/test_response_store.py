"""The Responses API's store of kept responses: bounded in count and size, least recently used first."""

from __future__ import annotations

import pytest

from localspec.server.response_store import (
    NotKeptError,
    PreviousNotFoundError,
    ResponseStore,
    StoredResponse,
    turns_size,
)
from localspec.types import ChatMessage, ToolCall


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
