"""One streamed reply: where it is shown, what has arrived, how it is stopped, and the thread that reads it.

The client is blocking httpx, so a thread worker reads the stream (`read_stream`)
into the reply's ChunkBuffer and posts a message when chunks wait; the UI takes
them in one go (`Reply.take`) into the live stats and the view: a Markdown stream,
or, with draft colouring on, plain text whose drafted chunks are coloured. Esc
aborts the stream's socket (StreamAbort): the thread wakes at once, even while the
daemon is still reading a long prompt, and the daemon cancels the generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from textual.message import Message
from textual.widgets import Markdown

from localspec.client import EventStream, StreamAbort
from localspec.errors import DaemonError, LocalspecError
from localspec.types import TokenChunk
from tui.chunk_buffer import ChunkBuffer
from tui.live_stats import LiveStats
from tui.messages import ReplyChunks, ReplyDone, ReplyFailed
from tui.widgets.chat_log import Turn
from tui.widgets.code_fence import PiecedFence
from tui.widgets.draft_view import DraftView
from tui.widgets.message_view import MessageView


class ReplyOutput(Protocol):
    """Where a reply's text goes as it arrives."""

    @property
    def view(self) -> Turn: ...

    async def write(self, chunks: Sequence[TokenChunk]) -> None: ...

    async def stop(self) -> None: ...


def quoted(reasoning: str) -> str:
    """A thinking model's reasoning as the Markdown quote shown above its answer."""
    return "> " + reasoning.replace("\n", "\n> ") + "\n\n" if reasoning else ""


class MarkdownOutput:
    """The usual view: Markdown, rendered incrementally (code blocks highlighted); a thinking
    model's reasoning as a quote before the answer."""

    def __init__(self, view: MessageView) -> None:
        self._view = view
        self._stream = Markdown.get_stream(view)
        self._quoting = False  # the reasoning's quote is open

    @property
    def view(self) -> Turn:
        return self._view

    async def write(self, chunks: Sequence[TokenChunk]) -> None:
        out: list[str] = []
        for chunk in chunks:
            if chunk.reasoning:
                out.append("" if self._quoting else "> ")
                out.append(chunk.reasoning.replace("\n", "\n> "))  # every line of it in the quote
                self._quoting = True
            if chunk.text:
                out.append("\n\n" if self._quoting else "")  # the answer ends the quote
                out.append(chunk.text)
                self._quoting = False
        await self._stream.write("".join(out))

    async def stop(self) -> None:
        await self._stream.stop()
        for fence in self._view.query(PiecedFence):
            await fence.settle()  # highlighted whole, now that no piece grows


class DraftOutput:
    """Draft colouring on: plain text, styled per chunk."""

    def __init__(self, view: DraftView) -> None:
        self._view = view

    @property
    def view(self) -> Turn:
        return self._view

    async def write(self, chunks: Sequence[TokenChunk]) -> None:
        self._view.append(chunks)

    async def stop(self) -> None:
        pass


# How often the view takes what has arrived while a reply streams. Each take re-renders the reply
# and lays the chat out again (20-45 ms of CPU for a long code block), and on a 2-core machine that
# CPU is taken from the engine's threads: taking each of the daemon's 25 chunks a second, the chat
# used half a core and decoded at 14 tok/s where a plain client read 24 from the same daemon; every
# 0.25 s, 19 tok/s. So the wait after a take is what the app's last interval cost in CPU over
# UI_SHARE (a twentieth of a core): a tenth of a second while renders are cheap, up to a second when
# dear; the chat then decoded level with the plain client (docs/benchmarks.md, session 50).
UI_SHARE = 0.05
TAKE_MIN_S, TAKE_MAX_S = 0.1, 1.0


def take_interval(cpu_s: float) -> float:
    """How long chunks wait after a take, given the CPU this app used since the one before."""
    return min(TAKE_MAX_S, max(TAKE_MIN_S, cpu_s / UI_SHARE))


@dataclass
class Reply:
    """The reply being streamed."""

    id: int
    output: ReplyOutput
    live: LiveStats
    buffer: ChunkBuffer = field(default_factory=ChunkBuffer)
    abort: StreamAbort = field(default_factory=StreamAbort)
    parts: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)  # a thinking model's reasoning
    next_take: float = 0.0  # monotonic time before which chunks wait (take_interval); the first goes at once
    cpu_at: float = field(default_factory=time.process_time)  # this process's CPU time at the last take

    @property
    def view(self) -> Turn:
        return self.output.view

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)

    async def take(self) -> None:
        """Everything that has arrived: into the live stats, the text and the view."""
        items = self.buffer.take()
        if not items:
            return
        cpu = time.process_time()
        self.next_take = time.monotonic() + take_interval(cpu - self.cpu_at)
        self.cpu_at = cpu
        for chunk, at in items:
            self.live.add(len(chunk.token_ids), chunk.from_draft, at)
            if chunk.progress is not None:
                self.live.reading = chunk.progress
        chunks = [chunk for chunk, _ in items if chunk.progress is None]
        if not chunks:
            return
        self.parts.extend(chunk.text for chunk in chunks)
        self.thoughts.extend(chunk.reasoning for chunk in chunks)
        await self.output.write(chunks)


def read_stream(
    events: EventStream,
    reply_id: int,
    buffer: ChunkBuffer,
    post: Callable[[Message], object],
    cancelled: Callable[[], bool],
) -> None:
    """The worker thread's loop: chunks into `buffer`, the end or a failure posted as a message."""
    try:
        for event in events:
            if cancelled():
                return
            if isinstance(event, TokenChunk):
                if buffer.put(event, time.monotonic()):
                    post(ReplyChunks(reply_id))
            else:
                post(ReplyDone(reply_id, event))
    except LocalspecError as exc:
        post(ReplyFailed(reply_id, exc))
    except Exception as exc:  # the edge: a bug or a garbled stream is a notification, not a crash
        post(ReplyFailed(reply_id, DaemonError(f"{type(exc).__name__}: {exc}")))
    finally:
        events.close()  # closes the connection: the daemon cancels the generation within one step
