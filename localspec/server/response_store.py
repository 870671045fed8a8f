"""The Responses API's stored responses: what `previous_response_id` continues and
`GET /v1/responses/{id}` returns.

OpenAI keeps every response unless asked not to (`store: false`); a conversation then goes on
from the last response's id, the client sending only what is new. Here they are kept in the
daemon's memory only (nothing on disk: a conversation is the user's, and a restart forgets
it), bounded in count and in size, the least recently used going first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from localspec.errors import LocalspecError, UserInputError
from localspec.types import ChatMessage

MAX_RESPONSES = 1024
MAX_BYTES = 64 * 1024 * 1024


# Why an id may name nothing: said in every not-found message.
FORGOTTEN = (
    "it was sent with store: false, deleted, or forgotten (the daemon keeps the latest "
    f"{MAX_RESPONSES} in memory, none across a restart)"
)


class ResponseNotFoundError(LocalspecError):
    """An id no kept response has (never stored, deleted, forgotten, or from before a restart)."""

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


def turns_size(turns: tuple[ChatMessage, ...]) -> int:
    return sum(
        len(t.content) + len(t.reasoning) + sum(len(c.arguments) + len(c.name) for c in t.tool_calls)
        for t in turns
    )


class ResponseStore:
    """Kept responses by id; thread-safe (routes run on the event loop, tests beside it)."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        with self._lock:
            old = self._kept.pop(response_id, None)
            self._bytes -= old.size if old else 0
            self._kept[response_id] = stored
            self._bytes += stored.size
            # The newest stays even where it alone is past the bound: its client is about to continue it.
            while len(self._kept) > 1 and self._over():
                _, gone = self._kept.popitem(last=False)
                self._bytes -= gone.size

    def _over(self) -> bool:
        return len(self._kept) > self.max_responses or self._bytes > self.max_bytes

    def find(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._kept.get(response_id)
            if stored is not None:
                self._kept.move_to_end(response_id)
            return stored

    def get(self, response_id: str) -> StoredResponse:
        stored = self.find(response_id)
        if stored is None:
            raise ResponseNotFoundError(f"no response with id {response_id!r} is kept here; {FORGOTTEN}")
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
        with self._lock:
            gone = self._kept.pop(response_id, None)
            if gone is not None:
                self._bytes -= gone.size
                return
        raise ResponseNotFoundError(f"no response with id {response_id!r} is kept here; {FORGOTTEN}")

    def __len__(self) -> int:
        return len(self._kept)
