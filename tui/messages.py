"""Messages the worker threads post to the app (Textual messages, as dataclasses).

Each reply carries the id of the request it belongs to, so a stopped request's
late chunks are recognised and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from localspec.client import Health
from localspec.errors import LocalspecError
from localspec.types import GenerationResult


@dataclass
class ReplyChunks(Message):
    """Chunks are waiting in the reply's ChunkBuffer."""

    reply_id: int


@dataclass
class ReplyDone(Message):
    reply_id: int
    result: GenerationResult


@dataclass
class ReplyFailed(Message):
    reply_id: int
    error: LocalspecError


@dataclass
class DaemonStatus(Message):
    """Progress while connecting: "loading models… 3 s"."""

    text: str


@dataclass
class DaemonReady(Message):
    health: Health
    served: tuple[str, ...] = ()  # every model the daemon serves, for the palette


@dataclass
class DaemonLost(Message):
    """The daemon failed to start or load, or stopped answering."""

    error: LocalspecError
