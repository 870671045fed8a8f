"""The Responses API's kept state: stored responses (what `previous_response_id` continues and
`GET /v1/responses/{id}` returns) and conversations (the Conversations API's: items a
response with `conversation` reads first and adds its own to).

OpenAI keeps every response unless asked not to (`store: false`); a conversation then goes on
from the last response's id, or in a conversation object, the client sending only what is new.
Here both are kept in the daemon's memory only (nothing on disk: a conversation is the user's,
and a restart forgets it), bounded in count and in size, the least recently used going first.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from localspec.errors import LocalspecError, UserInputError
from localspec.types import ChatMessage

MAX_RESPONSES = 1024
MAX_CONVERSATIONS = 256
MAX_BYTES = 64 * 1024 * 1024  # each store's


# Why an id may name nothing: said in every not-found message.
FORGOTTEN = (
    "it was sent with store: false, deleted, or forgotten (the daemon keeps the latest "
    f"{MAX_RESPONSES} in memory, none across a restart)"
)
FORGOTTEN_CONVERSATION = (
    f"it was deleted or forgotten (the daemon keeps the latest {MAX_CONVERSATIONS} in memory, none "
    "across a restart)"
)


class NotKeptError(LocalspecError):
    """An id nothing kept has (never stored, deleted, forgotten, or from before a restart)."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class PreviousNotFoundError(UserInputError):
    code = "previous_response_not_found"


@dataclass(frozen=True)
class StoredResponse:
    """One kept response: the conversation through its output (what a continuation reads after
    its own instructions), its request's input items, and the Response object itself."""

    turns: tuple[ChatMessage, ...]
    input_items: tuple[dict[str, Any], ...]
    body: dict[str, Any]
    size: int  # bytes of text held, roughly: what the bound counts


@dataclass
class Conversation:
    """One conversation: its items in order (messages, calls, their outputs, reasoning), as the
    Responses API writes them; changed only through ConversationStore, under its lock."""

    id: str
    metadata: dict[str, str]
    items: list[dict[str, Any]] = field(default_factory=list)
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        }

    def size(self) -> int:
        return sum(len(json.dumps(item)) for item in self.items) + len(json.dumps(self.metadata))


def turns_size(turns: tuple[ChatMessage, ...]) -> int:
    return sum(
        len(t.content) + len(t.reasoning) + sum(len(c.arguments) + len(c.name) for c in t.tool_calls)
        for t in turns
    )


_Value = TypeVar("_Value")


class _Bounded(Generic[_Value]):
    """Values by id, least recently used first out past `max_count` or `max_bytes`; the newest
    always stays (its client is about to use it). Thread-safe: routes run on the event loop,
    tests beside it."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, tuple[_Value, int]] = OrderedDict()
        self._bytes = 0
        self.lock = threading.RLock()

    def put(self, key: str, value: _Value, size: int) -> None:
        with self.lock:
            self.pop(key)
            self._kept[key] = (value, size)
            self._bytes += size
            while len(self._kept) > 1 and (len(self._kept) > self.max_count or self._bytes > self.max_bytes):
                _, (_, gone) = self._kept.popitem(last=False)
                self._bytes -= gone

    def find(self, key: str) -> _Value | None:
        with self.lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            self._kept.move_to_end(key)
            return kept[0]

    def pop(self, key: str) -> _Value | None:
        with self.lock:
            kept = self._kept.pop(key, None)
            if kept is None:
                return None
            self._bytes -= kept[1]
            return kept[0]

    def __len__(self) -> int:
        return len(self._kept)


class ResponseStore:
    """Kept responses by id."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self._kept: _Bounded[StoredResponse] = _Bounded(max_responses, max_bytes)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._kept.put(response_id, stored, stored.size)

    def find(self, response_id: str) -> StoredResponse | None:
        return self._kept.find(response_id)

    def get(self, response_id: str) -> StoredResponse:
        stored = self.find(response_id)
        if stored is None:
            raise NotKeptError(f"no response with id {response_id!r} is kept here; {FORGOTTEN}")
        return stored

    def previous(self, response_id: str) -> StoredResponse:
        """The response a request continues (`previous_response_id`): where none is kept, a 400, as
        OpenAI's."""
        stored = self.find(response_id)
        if stored is None:
            raise PreviousNotFoundError(
                f"previous_response_id: no response with id {response_id!r} is kept here; {FORGOTTEN}; "
                "send the whole conversation in `input` instead",
                param="previous_response_id",
            )
        return stored

    def delete(self, response_id: str) -> None:
        if self._kept.pop(response_id) is None:
            raise NotKeptError(f"no response with id {response_id!r} is kept here; {FORGOTTEN}")

    def __len__(self) -> int:
        return len(self._kept)


class ConversationStore:
    """Kept conversations by id; a conversation's items change under the store's lock."""

    def __init__(self, max_conversations: int = MAX_CONVERSATIONS, max_bytes: int = MAX_BYTES) -> None:
        self._kept: _Bounded[Conversation] = _Bounded(max_conversations, max_bytes)

    def create(self, metadata: dict[str, str], items: Sequence[dict[str, Any]]) -> Conversation:
        conversation = Conversation("conv_" + uuid.uuid4().hex[:24], dict(metadata), list(items))
        self._kept.put(conversation.id, conversation, conversation.size())
        return conversation

    def get(self, conversation_id: str, param: str | None = None) -> Conversation:
        conversation = self._kept.find(conversation_id)
        if conversation is None:
            raise NotKeptError(
                f"no conversation with id {conversation_id!r} is kept here; {FORGOTTEN_CONVERSATION}",
                param=param,
            )
        return conversation

    def items(self, conversation_id: str, param: str | None = None) -> list[dict[str, Any]]:
        """A copy of the conversation's items, as they are now."""
        with self._kept.lock:
            return list(self.get(conversation_id, param).items)

    def add(self, conversation_id: str, items: Sequence[dict[str, Any]]) -> Conversation:
        """Items a client adds: refused where they would take the conversation past the bound
        (a response's own items always go in: a prompt must fit the context, so they stay small)."""
        with self._kept.lock:
            conversation = self.get(conversation_id)
            if conversation.size() + sum(len(json.dumps(item)) for item in items) > self._kept.max_bytes:
                raise UserInputError(
                    f"conversation {conversation_id!r} would hold more than {self._kept.max_bytes >> 20} MiB "
                    "of items; start a new one",
                    param="items",
                )
            return self.change(conversation_id, lambda c: c.items.extend(items))

    def item(self, conversation_id: str, item_id: str) -> dict[str, Any]:
        with self._kept.lock:
            conversation = self.get(conversation_id)
            return conversation.items[_index(conversation, item_id)]

    def remove_item(self, conversation_id: str, item_id: str) -> Conversation:
        return self.change(conversation_id, lambda c: c.items.pop(_index(c, item_id)))

    def change(self, conversation_id: str, how: Callable[[Conversation], object]) -> Conversation:
        """The conversation changed by `how` (its items or metadata), its size counted again."""
        with self._kept.lock:
            conversation = self.get(conversation_id)
            how(conversation)
            self._kept.put(conversation.id, conversation, conversation.size())
            return conversation

    def delete(self, conversation_id: str) -> None:
        if self._kept.pop(conversation_id) is None:
            raise NotKeptError(
                f"no conversation with id {conversation_id!r} is kept here; {FORGOTTEN_CONVERSATION}"
            )

    def __len__(self) -> int:
        return len(self._kept)


def _index(conversation: Conversation, item_id: str) -> int:
    for i, item in enumerate(conversation.items):
        if item.get("id") == item_id:
            return i
    raise NotKeptError(f"conversation {conversation.id!r} has no item {item_id!r}")
