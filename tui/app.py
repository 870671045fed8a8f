"""The chat app: a conversation streamed from the daemon, with live speculation stats.

`make_app(settings, client)` builds it for the CLI and the tests alike. Replies
stream in a thread worker (tui.reply); Esc aborts the stream's connection at
once, even before the first chunk, and the daemon cancels the generation when
its client leaves. Failures become notifications with a way back (ctrl+r),
never a crash.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.widgets import Footer
from textual.worker import get_current_worker

from localspec.client import DEFAULT_MODEL, Client, Health
from localspec.errors import DaemonError, LocalspecError
from localspec.paths import Paths
from localspec.printable import printable
from localspec.settings import Settings
from localspec.types import METHODS, ChatMessage, Method, SpecParams
from tui.chats import Chat, ChatStore
from tui.commands import ChatCommands
from tui.connection import Connection, SessionDaemon
from tui.keys import bindings, help_rows
from tui.live_stats import LiveStats
from tui.messages import DaemonLost, DaemonReady, DaemonStatus, ReplyChunks, ReplyDone, ReplyFailed
from tui.reply import DraftOutput, MarkdownOutput, Reply, ReplyOutput, quoted, read_stream
from tui.screens.chat_picker import ChatPickerScreen
from tui.screens.help import HelpScreen
from tui.screens.models import ModelsScreen
from tui.screens.pick_draft import PickDraftScreen
from tui.screens.system_prompt import SystemPromptScreen
from tui.widgets.chat_log import ChatLog
from tui.widgets.prompt_input import PromptInput
from tui.widgets.stats_bar import StatsBar

DEFAULT_MAX_TOKENS = 1024
TICK_S = 0.25  # stats bar refresh while a reply streams
MEMORY_EVERY_S = 2.0
RECOVER_HINT = "ctrl+r reconnects (or restarts the daemon)"


class ChatApp(App[None]):
    """localspec chat."""

    CSS_PATH = "app.tcss"
    TITLE = "localspec chat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS: ClassVar[list[BindingType]] = bindings()

    def __init__(
        self,
        settings: Settings,
        connection: Connection,
        store: ChatStore,
        chat: Chat,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        pick_chat: bool = False,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.connection = connection
        self.store = store
        self.chat = chat
        self.max_tokens = max_tokens
        self.pick_chat = pick_chat
        self.health: Health | None = None
        self.method: Method = settings.method
        self.k = settings.k
        self.reply: Reply | None = None
        self.last_live: LiveStats | None = None
        self.memory: int | None = None
        self.colour_drafts = False  # f2: replies streamed as plain text, drafted chunks coloured
        self._reply_ids = 0
        self._memory_at = 0.0
        self._resend_when_ready = False
        self.model: str | None = None  # the daemon's model this chat talks to; None: its default
        self.served: list[str] = []  # the daemon's models, for the palette (read when it is ready)

    # --- layout and start ---------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield ChatLog(id="chat-log")
        yield StatsBar(id="stats")
        yield PromptInput(id="prompt")
        yield Footer()

    async def on_mount(self) -> None:
        await self._show_chat()
        self.query_one(PromptInput).focus()
        self.set_interval(TICK_S, self._tick)
        self.connect()
        if self.pick_chat:
            self.action_open_chat()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop" and not self.generating:
            return None  # shown dimmed in the footer: nothing to stop
        return True

    @property
    def generating(self) -> bool:
        return self.reply is not None

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def stats_bar(self) -> StatsBar:
        return self.query_one(StatsBar)

    async def _show_chat(self) -> None:
        await self.chat_log.clear()
        if self.chat.system_prompt:
            await self.chat_log.add("system", self.chat.system_prompt)
        for message in self.chat.messages:
            await self.chat_log.add(message.role, quoted(message.reasoning) + message.content)
        self.sub_title = self.chat.title if self.chat.messages else ""

    # --- the daemon ---------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="connect")
    def connect(self) -> None:
        worker = get_current_worker()
        try:
            health = self.connection.wait_ready(
                lambda text: self.post_message(DaemonStatus(text)), lambda: worker.is_cancelled
            )
        except LocalspecError as exc:
            self.post_message(DaemonLost(exc))
            return
        if health is not None:
            self.post_message(DaemonReady(health, self._served()))

    def _served(self) -> tuple[str, ...]:
        """The daemon's models, for the palette; none where it cannot list them (an older daemon)."""
        try:
            return tuple(self.connection.client.models())
        except LocalspecError:
            return ()

    @work(thread=True, exclusive=True, group="connect")
    def recover(self, target: Path | None = None) -> None:
        """Get a daemon back (or serve another target), then connect again."""
        self.post_message(DaemonStatus("reconnecting…"))
        try:
            if target is not None:
                self.connection.switch_target(target)
            else:
                self.connection.recover()
        except LocalspecError as exc:
            self.post_message(DaemonLost(exc))
            return
        self.call_from_thread(self.connect)

    def on_daemon_status(self, message: DaemonStatus) -> None:
        self.stats_bar.show_status(f"{message.text} — {self.connection.describe()}")

    def on_daemon_ready(self, message: DaemonReady) -> None:
        first = self.health is None and self.last_live is None
        self.health = message.health
        self.served = list(message.served)
        if first and self.connection.session is None:
            # A shared daemon: its own defaults, unless the user gave a method or k on the command line.
            given = "method" in self.settings.model_fields_set
            self.method = self.settings.method if given else daemon_method(message.health)
            self.k = self.settings.k or message.health.k or self.k  # settings.k is None unless given
        self.notify(f"connected to {self.connection.describe()}", title="ready", timeout=4)
        self._update_stats()
        if self._resend_when_ready:
            self._resend_when_ready = False
            self.call_later(self.action_retry)

    def on_daemon_lost(self, message: DaemonLost) -> None:
        self.health = None
        self.stats_bar.show_status(f"no daemon: {RECOVER_HINT}")
        self.notify(
            f"{printable(message.error.message)}\n{RECOVER_HINT}",
            title="daemon",
            severity="error",
            timeout=30,
            markup=False,
        )

    # --- sending and streaming ----------------------------------------------------------

    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        if self.generating:
            self.notify("a reply is still streaming: Esc stops it", severity="warning")
            return
        if self.health is None:
            self.notify(f"the daemon is not ready yet; {RECOVER_HINT}", severity="warning")
            return
        event.prompt_input.clear()
        self.chat.messages.append(ChatMessage("user", event.text))
        self.sub_title = self.chat.title
        self.store.save(self.chat)
        await self.chat_log.add("user", event.text)
        await self.start_reply()

    async def start_reply(self) -> None:
        self._reply_ids += 1
        output: ReplyOutput
        if self.colour_drafts:
            output = DraftOutput(await self.chat_log.add_draft_view())
        else:
            output = MarkdownOutput(await self.chat_log.add("assistant"))
        self.reply = reply = Reply(self._reply_ids, output, LiveStats(time.monotonic()))
        self.last_live = reply.live
        spec = SpecParams(self.method, self.k)
        self.stream_reply(reply, self.chat.request_messages(), spec)
        self.refresh_bindings()
        self._update_stats()

    @work(thread=True, exclusive=True, group="reply")
    def stream_reply(self, reply: Reply, messages: list[ChatMessage], spec: SpecParams) -> None:
        # This thread touches only the reply's buffer and abort, both thread-safe.
        worker = get_current_worker()
        client = self.connection.client
        client.model = self.model or DEFAULT_MODEL
        events = client.chat_stream(
            messages,
            max_tokens=self.max_tokens,
            speculative=spec,
            abort=reply.abort,
            truncate=True,
            progress=True,
        )
        read_stream(events, reply.id, reply.buffer, self.post_message, lambda: worker.is_cancelled)

    async def on_reply_chunks(self, message: ReplyChunks) -> None:
        reply = self.reply
        if reply is None or reply.id != message.reply_id:
            return
        wait = reply.next_take - time.monotonic()
        if wait > 0:  # the chunks wait in the buffer; it tells no one again until they are taken
            self.set_timer(wait, reply.take)
        else:
            await reply.take()

    async def on_reply_done(self, message: ReplyDone) -> None:
        if self.reply is not None and self.reply.id == message.reply_id:
            await self.reply.take()
            self.reply.live.finish(message.result.stats)
            dropped = message.result.stats.dropped_messages
            await self._end_reply(None)
            if dropped:
                # A long chat goes on as Ollama's does; the person should know what the model no longer saw.
                self.notify(
                    f"the {dropped} oldest messages no longer fit the context: the model did not see them",
                    title="context",
                    timeout=10,
                )

    async def on_reply_failed(self, message: ReplyFailed) -> None:
        if self.reply is None or self.reply.id != message.reply_id:
            return
        error = message.error
        if isinstance(error, DaemonError):
            # Before the reply ends: ending it awaits, and no one may see a reply over while the
            # daemon that failed it still looks ready, or its last speed still on the stats bar.
            self.health = None
            self.stats_bar.show_status(f"daemon lost: {RECOVER_HINT}")
        await self._end_reply("failed")
        if isinstance(error, DaemonError):
            text = f"{printable(error.message)}\n{RECOVER_HINT}"
            self.notify(text, title="daemon", severity="error", timeout=30, markup=False)
        else:
            text = printable(error.message)
            self.notify(text, title="request failed", severity="error", timeout=15, markup=False)

    async def _end_reply(self, note: str | None) -> None:
        reply, self.reply = self.reply, None
        if reply is None:
            return
        await reply.take()
        await reply.output.stop()
        if note is not None:
            reply.view.mark(note)
        if reply.text:
            self.chat.messages.append(ChatMessage("assistant", reply.text, reasoning=reply.reasoning))
        elif note is not None:
            await reply.view.remove()
        self.store.save(self.chat)
        self.refresh_bindings()
        self._update_stats()

    # --- stats --------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._memory_at >= MEMORY_EVERY_S:
            self._memory_at = now
            self.memory = self.connection.memory()
            self._check_session()
            self._update_stats()
        elif self.generating:
            self._update_stats()

    def _check_session(self) -> None:
        """A daemon this chat started that died while idle is reported at once, not at the next send."""
        session = self.connection.session
        if self.health is not None and not self.generating and session is not None and not session.running:
            self.post_message(DaemonLost(DaemonError("the daemon started for this chat has exited")))

    def _update_stats(self) -> None:
        if self.health is None:
            return
        self.stats_bar.show(
            live=self.last_live,
            now=time.monotonic(),
            method=self.method,
            k=self.k,
            memory=self.memory,
            health=self.health,
            model=self.model,
        )

    # --- actions ------------------------------------------------------------------------

    async def action_stop(self) -> None:
        """Esc: stop the reply; what arrived so far stays in the chat."""
        if self.reply is None:
            return
        self.reply.abort.abort()  # wakes the worker at once, even while the daemon reads the prompt
        self.workers.cancel_group(self, "reply")
        await self._end_reply("stopped")

    async def action_new_chat(self) -> None:
        await self.action_stop()
        self.chat = Chat.new(self.chat.system_prompt)
        self.last_live = None
        await self._show_chat()
        self._update_stats()
        self.notify("new chat")

    def action_open_chat(self) -> None:
        self.push_screen(ChatPickerScreen(self.store.saved()), self._open_chat)

    async def _open_chat(self, chat_id: str | None) -> None:
        if chat_id is None:
            return
        await self.action_stop()
        try:
            self.chat = self.store.load(chat_id)
        except LocalspecError as exc:
            self.notify(printable(exc.message), severity="error", markup=False)
            return
        self.last_live = None
        await self._show_chat()
        self.notify(f"resumed {self.chat.id}")

    def action_system_prompt(self) -> None:
        self.push_screen(SystemPromptScreen(self.chat.system_prompt), self._set_system_prompt)

    async def _set_system_prompt(self, prompt: str | None) -> None:
        if prompt is None or prompt == self.chat.system_prompt:
            return
        self.chat.system_prompt = prompt
        self.store.save(self.chat)
        if not self.generating:
            await self._show_chat()
        self.notify("system prompt set" if prompt else "system prompt cleared")

    async def action_retry(self) -> None:
        """Reconnect when the daemon is gone; else answer the last user message again."""
        if self.generating:
            return
        if self.health is None:
            self._resend_when_ready = bool(self.chat.messages)
            self.recover()
            return
        if self.chat.messages and self.chat.messages[-1].role == "assistant":
            self.chat.messages.pop()
            views = self.chat_log.views
            if views and views[-1].role == "assistant":
                await views[-1].remove()
        if self.chat.messages and self.chat.messages[-1].role == "user":
            await self.start_reply()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_rows()))

    def action_models(self) -> None:
        screen = ModelsScreen(self.health, self.settings.draft, self.connection.client, self.model)
        self.push_screen(screen, self.use_model)

    def use_model(self, name: str | None) -> None:
        """Talk to another of the daemon's models from the next message on; the daemon loads it."""
        if name is None:
            return
        self.model = name
        self._update_stats()
        self.notify(printable(f"this chat now talks to {name}; the daemon loads it on the next message"))

    def action_pick_draft(self) -> None:
        if self.health is None:
            self.notify(f"the daemon is not ready; {RECOVER_HINT}", severity="warning")
            return
        self.push_screen(PickDraftScreen(self.health, self.connection.target_files()))

    async def action_toggle_draft_colours(self) -> None:
        self.colour_drafts = not self.colour_drafts
        if self.colour_drafts:
            self.notify("from the next reply, text from accepted drafts is coloured (plain text)")
            return
        self.notify("draft colouring off")
        if not self.generating:
            await self._show_chat()  # coloured replies back to Markdown

    def set_method(self, method: Method) -> None:
        self.method = method
        available = self.health.methods if self.health is not None else ()
        if method not in ("auto", "none") and method not in available:
            self.notify(f"{method} is not loaded on this daemon; it will fall back", severity="warning")
        self._update_stats()

    def set_k(self, k: int) -> None:
        self.k = k
        self._update_stats()


def daemon_method(health: Health) -> Method:
    """The method a daemon answers with when a request names none (`serve --method`); auto where it
    says nothing this chat knows."""
    return next((m for m in METHODS if m == health.method), "auto")


def make_app(
    settings: Settings,
    client: Client,
    *,
    session: SessionDaemon | None = None,
    store: ChatStore | None = None,
    resume: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> ChatApp:
    """The chat app on `client`; `session` is a daemon the caller started for it (restartable).

    `resume` names a saved chat (id or unique prefix); "" opens the list to pick from.
    """
    store = store or ChatStore(Paths.from_env().chats_dir)
    chat = store.load(resume) if resume else Chat.new()
    connection = Connection(client, settings, session)
    return ChatApp(settings, connection, store, chat, max_tokens=max_tokens, pick_chat=resume == "")
