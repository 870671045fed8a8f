"""Saved conversations: one JSON file per chat under the state directory, resumable by id.

Ids are made here (a timestamp and a random suffix) and checked against a strict
pattern before they become file names, so `--resume ../../x` can never name a
file outside the chats folder.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.atomicfile import write_text_atomic
from localspec.errors import UserInputError
from localspec.types import ChatMessage

_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$")
TITLE_CHARS = 60


class ChatNotFoundError(UserInputError):
    """`--resume ID` names no saved chat (or several)."""

    code = "chat_not_found"


@dataclass
class Chat:
    """One conversation: the system prompt and the user/assistant turns, in order."""

    id: str
    created: float
    updated: float
    system_prompt: str = ""
    messages: list[ChatMessage] = field(default_factory=list)

    @classmethod
    def new(cls, system_prompt: str = "") -> Chat:
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        return cls(f"{stamp}-{secrets.token_hex(2)}", now, now, system_prompt)

    @property
    def title(self) -> str:
        """The first user message, on one line and cut short."""
        first = next((m.content for m in self.messages if m.role == "user"), "")
        line = " ".join(first.split()) or "(empty chat)"
        return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"

    def request_messages(self) -> list[ChatMessage]:
        """What is sent to the model: the system prompt (when set), then every turn."""
        system = [ChatMessage("system", self.system_prompt)] if self.system_prompt.strip() else []
        return system + self.messages

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created": self.created,
            "updated": self.updated,
            "system_prompt": self.system_prompt,
            "messages": [_message_dict(m) for m in self.messages],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chat:
        messages = [
            ChatMessage(str(m["role"]), str(m["content"]), reasoning=str(m.get("reasoning", "")))
            for m in data.get("messages", [])
        ]
        return cls(
            id=str(data["id"]),
            created=float(data.get("created", 0.0)),
            updated=float(data.get("updated", 0.0)),
            system_prompt=str(data.get("system_prompt", "")),
            messages=messages,
        )


def _message_dict(message: ChatMessage) -> dict[str, str]:
    """A turn as the chat's file keeps it: a thinking model's reasoning beside its answer, where it
    wrote one (shown again when the chat is resumed; never sent back to the model)."""
    saved = {"role": message.role, "content": message.content}
    return {**saved, "reasoning": message.reasoning} if message.reasoning else saved


class ChatStore:
    """The chats folder: save, load by id (or a unique prefix of one), list newest first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, chat_id: str) -> Path:
        if not _ID.match(chat_id):
            raise ChatNotFoundError(f"{chat_id!r} is not a chat id (like 20250101-120000-ab12)")
        return self.directory / f"{chat_id}.json"

    def save(self, chat: Chat) -> Path:
        """Write atomically (a crash mid-write leaves the previous version), private to the user."""
        chat.updated = time.time()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(chat.id)
        write_text_atomic(path, json.dumps(chat.to_dict(), ensure_ascii=False, indent=1), mode=0o600)
        return path

    def load(self, chat_id: str) -> Chat:
        """The chat with this id, or the only one whose id starts with it."""
        if not _ID.match(chat_id):
            matches = [c for c in self._ids() if c.startswith(chat_id)] if chat_id else []
            if len(matches) != 1:
                found = "no saved chat matches" if not matches else f"{len(matches)} saved chats match"
                raise ChatNotFoundError(f"{found} {chat_id!r}; `localspec chat --list` lists them")
            chat_id = matches[0]
        try:
            data = json.loads(self.path(chat_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ChatNotFoundError(f"no saved chat {chat_id!r} in {self.directory}") from None
        except ValueError as exc:
            raise ChatNotFoundError(f"the saved chat {chat_id!r} is not valid JSON: {exc}") from None
        return Chat.from_dict(data)

    def saved(self) -> list[Chat]:
        """Every readable saved chat, most recently updated first; unreadable files are passed over."""
        chats = []
        for chat_id in self._ids():
            try:
                chats.append(self.load(chat_id))
            except ChatNotFoundError:
                continue
        return sorted(chats, key=lambda c: c.updated, reverse=True)

    def _ids(self) -> list[str]:
        try:
            names = [p.stem for p in self.directory.glob("*.json")]
        except OSError:
            return []
        return sorted(n for n in names if _ID.match(n))
