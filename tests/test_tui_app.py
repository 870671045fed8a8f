"""The chat app driven by Textual's pilot in 80x24, against a real daemon on the tiny models."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemonproc import LONG_CHAT, Daemon, metric, start_daemon, wait_for_metric
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import OptionList, Static, TextArea

from localspec.client import Client
from localspec.settings import load_settings
from localspec.types import ChatMessage
from tui.app import ChatApp, make_app
from tui.chats import Chat, ChatStore
from tui.connection import SessionDaemon
from tui.reply import TAKE_MIN_S, Reply
from tui.screens.chat_picker import ChatPickerScreen
from tui.screens.help import HelpScreen
from tui.screens.models import ModelsScreen
from tui.screens.pick_draft import PickDraftScreen
from tui.widgets.draft_view import DRAFT_STYLE, DraftView
from tui.widgets.message_view import MessageView
from tui.widgets.prompt_input import PromptInput
from tui.widgets.stats_bar import StatsBar

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]

SIZE = (80, 24)
LONG_CTX = 16384


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_perfect_draft: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("tui-home")
    # A long context: the long chat goes on until it is full, long enough to be stopped mid-way.
    d = start_daemon(home, tiny_target, "--draft", str(tiny_perfect_draft), ctx=LONG_CTX)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def store(localspec_home: Path) -> ChatStore:
    return ChatStore(localspec_home / "state" / "chats")


@pytest.fixture
def new_app(daemon: Daemon, store: ChatStore) -> Iterator[Callable[..., ChatApp]]:
    """make_app on a fresh client to the module's daemon; the clients are closed after the test."""
    clients: list[Client] = []

    def factory(
        resume: str | None = None, max_tokens: int = 40, method: str | None = None, target: Path | None = None
    ) -> ChatApp:
        client = daemon.client()
        clients.append(client)
        settings = load_settings(method=method, target=target)
        return make_app(settings, client, store=store, resume=resume, max_tokens=max_tokens)

    yield factory
    for client in clients:
        client.close()


async def wait_until(pilot: Pilot[None], predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app run until `predicate()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        await pilot.pause(0.02)


async def ready(pilot: Pilot[None], app: ChatApp) -> None:
    await wait_until(pilot, lambda: app.health is not None)


async def type_and_send(pilot: Pilot[None], text: str) -> None:
    await pilot.click(PromptInput)
    for char in text:
        await pilot.press("space" if char == " " else char)
    await pilot.press("enter")


def replies(app: ChatApp) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


async def test_the_chat_answers_with_a_shared_daemons_own_method_unless_given_one(
    tmp_path: Path, tiny_target: Path, store: ChatStore
) -> None:
    ngram = start_daemon(tmp_path / "ngram-home", tiny_target, "--method", "ngram", ctx=512)
    try:
        for given, expected in ((None, "ngram"), ("none", "none")):
            with ngram.client() as client:
                app = make_app(load_settings(method=given), client, store=store, max_tokens=8)
                async with app.run_test(size=SIZE) as pilot:
                    await ready(pilot, app)
                    assert app.method == expected
                    await type_and_send(pilot, "hello")
                    await wait_until(pilot, lambda a=app: not a.generating and len(a.chat.messages) == 2)  # type: ignore[misc]
                    assert app.last_live is not None and app.last_live.final is not None
                    assert app.last_live.final.method == expected  # what the daemon ran
    finally:
        assert ngram.stop() == 0, ngram.log()


async def test_type_send_and_see_the_streamed_reply_and_stats(
    new_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    app = new_app(method="draft")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert app.method == "draft"  # given on the command line: not the shared daemon's default
        assert "target tiny-target" in str(app.query_one("#stats-models").render())
        await type_and_send(pilot, "hello world")
        await wait_until(pilot, lambda: not app.generating and len(app.chat.messages) == 2)
        user, reply = app.chat.messages
        assert user == ChatMessage("user", "hello world")
        assert reply.role == "assistant" and reply.content
        assert app.query_one(PromptInput).text == ""
        # The reply was streamed into a Markdown view: its source is what arrived.
        assert replies(app)[-1].source == reply.content
        live = app.last_live
        assert live is not None and live.final is not None and live.tokens > 0
        assert live.final.acceptance_rate == 1.0  # the perfect draft: every drafted token accepted
        await wait_until(pilot, lambda: "tok/s" in app.query_one(StatsBar).speed_text)
        text = app.query_one(StatsBar).speed_text
        assert "TTFT" in text and "draft k=4" in text and "accept 100%" in text, text
    saved = store.load(app.chat.id)
    assert saved.messages == app.chat.messages


async def test_a_long_reply_is_drawn_in_spaced_takes(
    localspec_home: Path, tiny_endless: Path, store: ChatStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The view takes what has arrived at most every TAKE_MIN_S (longer where drawing costs more),
    not each of the daemon's chunks: on 2 cores the chat's drawing was taken from the engine."""
    taken: list[tuple[float, int]] = []
    take = Reply.take

    async def timed(reply: Reply) -> None:
        before = len(reply.parts)
        await take(reply)
        if len(reply.parts) > before:
            taken.append((time.monotonic(), len(reply.parts) - before))

    monkeypatch.setattr(Reply, "take", timed)
    daemon = start_daemon(localspec_home / "endless", tiny_endless, ctx=LONG_CTX)
    client = daemon.client()
    app = make_app(load_settings(method="none"), client, store=store, max_tokens=LONG_CTX)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await type_and_send(pilot, LONG_CHAT[0]["content"])
            await wait_until(pilot, lambda: len(taken) >= 6)
            await pilot.press("escape")
            assert replies(app)[-1].source == app.chat.messages[-1].content  # all that arrived, drawn
    finally:
        client.close()
        assert daemon.stop() == 0, daemon.log()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(taken)]
    assert sum(n for _, n in taken) > 2 * len(taken)  # each take gathered several chunks
    # Each waited at least TAKE_MIN_S after the one before (the last comes with Esc).
    assert all(gap >= TAKE_MIN_S - 0.01 for gap in gaps[:-1]), gaps


async def test_ctrl_j_adds_a_line_and_enter_sends_both(new_app: Callable[..., ChatApp]) -> None:
    app = new_app(max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.click(PromptInput)
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one(PromptInput).text == "a\nb"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.chat.messages) == 2 and not app.generating)
        assert app.chat.messages[0].content == "a\nb"


async def test_escape_stops_a_long_reply_and_the_daemon_cancels_it(
    localspec_home: Path, tiny_endless: Path, store: ChatStore
) -> None:
    # A reply with no end: the tiny target's own ends within a second, before a key could stop it.
    daemon = start_daemon(localspec_home / "endless", tiny_endless, ctx=LONG_CTX)
    client = daemon.client()
    app = make_app(load_settings(method="none"), client, store=store, max_tokens=LONG_CTX)
    try:
        await _escape_stops(app)
        # The stream was closed: the daemon records a cancelled generation.
        assert wait_for_metric(daemon, 'localspec_generations_total{finish="cancelled"}', 1) >= 1
    finally:
        client.close()
        assert daemon.stop() == 0, daemon.log()


async def _escape_stops(app: ChatApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await type_and_send(pilot, LONG_CHAT[0]["content"])
        await wait_until(pilot, lambda: app.last_live is not None and app.last_live.tokens >= 1)
        await pilot.press("escape")
        assert not app.generating
        view = replies(app)[-1]
        assert view.border_subtitle == "stopped"
        stopped = app.chat.messages[-1]
        assert stopped.role == "assistant" and stopped.content


def metrics(daemon: Daemon) -> str:
    with daemon.http() as http:
        return http.get("/metrics").text


def reply_workers(app: ChatApp) -> list[object]:
    return [w for w in app.workers if w.group == "reply" and w.is_running]


async def test_escape_during_a_long_prompt_stops_at_once_and_the_daemon_cancels_it(
    new_app: Callable[..., ChatApp], daemon: Daemon
) -> None:
    app = new_app(max_tokens=8, method="none")
    cancelled = 'localspec_generations_total{finish="cancelled"}'
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        before = metrics(daemon)
        # About 12,000 tokens: seconds of prompt evaluation for the tiny model on one thread.
        app.query_one(PromptInput).text = "the model is " * 4000
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.generating)
        # Wait until the daemon is reading the prompt (and has sent nothing), then stop.
        await wait_until(pilot, lambda: metric(metrics(daemon), "localspec_in_flight") >= 1)
        assert app.last_live is not None and app.last_live.tokens == 0
        await pilot.press("escape")
        assert not app.generating
        assert [m.role for m in app.chat.messages] == ["user"]  # nothing arrived: no empty reply kept
        assert not [v for v in app.chat_log.views if v.role == "assistant"]
        # The reading thread woke at once (its socket was shut down), not at the first chunk.
        await wait_until(pilot, lambda: not reply_workers(app), timeout=2)
        # The daemon stopped while reading the prompt: cancelled, and not one token generated.
        once_more = metric(before, cancelled) + 1
        assert wait_for_metric(daemon, cancelled, once_more) == once_more
        generated = "localspec_generated_tokens_total"
        assert metric(metrics(daemon), generated) == metric(before, generated)
        # The engine is fine afterwards.
        await type_and_send(pilot, "hello")
        await wait_until(pilot, lambda: not app.generating and app.chat.messages[-1].role == "assistant")


async def test_a_long_prompt_shows_how_far_its_read_has_got(new_app: Callable[..., ChatApp]) -> None:
    """A pasted file takes seconds to read (a minute on a CPU for a big one): the stats bar says how
    much of it is read, and how fast, until the first token, where the speeds take over."""
    app = new_app(max_tokens=4, method="none")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        # About 12,000 tokens, none of them cached: another test's long prompt starts otherwise.
        app.query_one(PromptInput).text = "a value " + "the model is " * 4000
        await pilot.press("enter")
        await wait_until(pilot, lambda: "prompt tokens" in app.query_one(StatsBar).speed_text)
        seen = app.query_one(StatsBar).speed_text
        assert seen.startswith("reading ") and "/12," in seen, seen
        live = app.last_live
        assert live is not None and live.reading is not None and live.tokens == 0
        assert live.reading.processed < live.reading.total
        await wait_until(pilot, lambda: not app.generating and app.chat.messages[-1].role == "assistant")
        assert live.reading.processed == live.reading.total  # the last report: all of it read
        await wait_until(pilot, lambda: "tok/s" in app.query_one(StatsBar).speed_text)
        assert "prompt tokens" not in app.query_one(StatsBar).speed_text


async def test_palette_shows_the_pick_draft_choice(
    new_app: Callable[..., ChatApp], tiny_target: Path
) -> None:
    app = new_app(target=tiny_target)  # the daemon's /health names its target by file name only
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("ctrl+p")
        await pilot.pause()
        for char in "pick-draft":
            await pilot.press(char)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, PickDraftScreen))
        screen = app.screen
        assert isinstance(screen, PickDraftScreen)
        await wait_until(pilot, lambda: screen.choice is not None, timeout=60)
        text = str(screen.query_one("#pick-text", Static).render())
        assert "target: tiny-target.gguf" in text and "choice: " in text and "why: " in text, text
        assert screen.choice is not None and screen.choice.candidates
        assert screen.choice.candidates[0].label in text
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, PickDraftScreen))


async def test_f2_colours_the_text_that_came_from_accepted_drafts(new_app: Callable[..., ChatApp]) -> None:
    app = new_app(method="draft", max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await type_and_send(pilot, "hello world")
        await wait_until(pilot, lambda: len(app.chat.messages) == 2 and not app.generating)
        assert not app.query(DraftView)  # off by default: Markdown
        await pilot.press("f2")
        assert app.colour_drafts
        await type_and_send(pilot, "hello again")
        await wait_until(pilot, lambda: len(app.chat.messages) == 4 and not app.generating)
        view = app.query_one(DraftView)
        # The perfect draft: every step after the first token is accepted drafts, so coloured.
        assert "".join(text for text, _ in view.spans) == app.chat.messages[-1].content
        assert any(style == DRAFT_STYLE for _, style in view.spans)
        draft_colour = app.theme_variables["text-success"].lower()
        colours = {
            segment.style.color.name.lower()
            for y in range(view.size.height)
            for segment in view.render_line(y)
            if segment.style is not None and segment.style.color is not None and segment.text.strip()
        }
        assert draft_colour in colours and len(colours) == 2, (draft_colour, colours)  # and the target's
        await pilot.press("f2")  # off: the chat is shown as Markdown again
        await wait_until(pilot, lambda: not app.query(DraftView))
        assert [v.role for v in app.query(MessageView)] == ["user", "assistant", "user", "assistant"]


async def test_resume_a_saved_chat_by_id_and_from_the_list(
    new_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    chat = Chat.new("be brief")
    chat.messages += [ChatMessage("user", "first question"), ChatMessage("assistant", "first answer")]
    store.save(chat)
    app = new_app(resume=chat.id[:15])
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        assert [v.role for v in app.query(MessageView)] == ["system", "user", "assistant"]
        await type_and_send(pilot, "second")
        await wait_until(pilot, lambda: len(app.chat.messages) == 4 and not app.generating)
    assert len(store.load(chat.id).messages) == 4

    picker_app = new_app(resume="")
    async with picker_app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(picker_app.screen, ChatPickerScreen))
        options = picker_app.screen.query_one(OptionList)
        assert options.option_count == 1
        options.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: picker_app.chat.id == chat.id)
        assert len(picker_app.query(MessageView)) == 5


async def test_a_chat_past_the_context_goes_on_without_its_oldest_messages(
    new_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    """As `ollama run` does: the daemon leaves out the oldest turns, and the person is told."""
    chat = Chat.new("be brief")
    turn = " ".join(["the model reads the file and writes the test"] * 250)  # ~2,500 tokens
    for i in range(8):
        chat.messages.append(ChatMessage("user" if i % 2 == 0 else "assistant", f"{i} {turn}"))
    store.save(chat)
    app = new_app(resume=chat.id, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await type_and_send(pilot, "and now")
        await wait_until(pilot, lambda: len(app.chat.messages) == 10 and not app.generating, timeout=60)
        final = app.last_live.final if app.last_live is not None else None
        assert final is not None and final.dropped_messages > 0
        assert final.prompt_tokens <= LONG_CTX - 8
        shown = [n.message for n in app._notifications]
        assert any(f"the {final.dropped_messages} oldest messages no longer fit" in m for m in shown), shown
    assert len(store.load(chat.id).messages) == 10  # the saved chat keeps every message


async def test_new_chat_system_prompt_and_help(new_app: Callable[..., ChatApp]) -> None:
    app = new_app(max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await type_and_send(pilot, "hi")
        await wait_until(pilot, lambda: len(app.chat.messages) == 2 and not app.generating)
        first = app.chat.id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.chat.id != first and not app.query(MessageView))
        await pilot.press("ctrl+t")
        await pilot.pause()
        app.screen.query_one(TextArea).text = "You answer in French."
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.chat.system_prompt == "You answer in French.")
        assert [v.role for v in app.query(MessageView)] == ["system"]
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_palette_switches_method_and_k(new_app: Callable[..., ChatApp]) -> None:
    app = new_app(max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        for query, check in (("method ngram", lambda: app.method == "ngram"), ("k = 2", lambda: app.k == 2)):
            await pilot.press("ctrl+p")
            await pilot.pause()
            for char in query:
                await pilot.press("space" if char == " " else char)
            await pilot.pause(0.3)
            await pilot.press("enter")
            await wait_until(pilot, check)
        await type_and_send(pilot, "hello world")
        await wait_until(pilot, lambda: len(app.chat.messages) == 2 and not app.generating)
        assert app.last_live is not None and app.last_live.final is not None
        assert app.last_live.final.method in ("ngram", "none")


async def test_daemon_gone_mid_stream_is_a_notice_and_ctrl_r_recovers(
    localspec_home: Path, tiny_endless: Path, store: ChatStore
) -> None:
    own = start_daemon(localspec_home / "own", tiny_endless, ctx=LONG_CTX)
    settings = load_settings(target=tiny_endless, threads=1, n_ctx=2048, method="none")
    app = make_app(settings, own.client(), store=store, max_tokens=LONG_CTX)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await type_and_send(pilot, LONG_CHAT[0]["content"])
            await wait_until(pilot, lambda: app.last_live is not None and app.last_live.tokens >= 5)
            own.proc.kill()
            own.proc.wait()
            # The reply is marked at the end of its ending; the stats bar must say so from its start.
            await wait_until(pilot, lambda: not app.generating)
            assert app.health is None
            assert "ctrl+r" in app.query_one(StatsBar).speed_text
            await wait_until(pilot, lambda: replies(app)[-1].border_subtitle == "failed")
            # ctrl+r: no daemon answers on that socket, so the chat starts its own and asks again.
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: app.connection.started_here and app.health is not None, 60)
            await wait_until(pilot, lambda: not app.generating and app.chat.messages[-1].role == "assistant")
            assert [m.role for m in app.chat.messages] == ["user", "assistant"]
    finally:
        app.connection.close()
        own.stop()
    session = app.connection.session
    assert session is not None and not session.running


async def test_a_model_that_fails_to_load_is_a_notice_not_a_crash(tmp_path: Path, store: ChatStore) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    settings = load_settings(target=broken, threads=1)
    session = SessionDaemon(settings)
    session.start()
    app = make_app(settings, Client(socket_path=session.socket_path), session=session, store=store)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "ctrl+r" in app.query_one(StatsBar).speed_text, 60)
            assert app.health is None
            await type_and_send(pilot, "hello")
            assert app.chat.messages == []  # not sent: the text stays in the box for later
            assert app.query_one(PromptInput).text == "hello"
    finally:
        app.connection.close()


async def test_switching_models_through_the_daemon_from_the_models_screen(
    tmp_path: Path, tiny_dir: Path, tiny_target: Path, tiny_useless_draft: Path, store: ChatStore
) -> None:
    """The daemon serves every model in its folder: the chat picks another, and the daemon loads it."""
    d = start_daemon(tmp_path / "home", tiny_target, env={"LOCALSPEC_MODELS": str(tiny_dir)})
    app = make_app(load_settings(), d.client(), store=store, max_tokens=8)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert "tiny-useless-draft" in app.served  # the palette offers "Model: tiny-useless-draft"
            app.action_models()
            await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.is_mounted)
            screen = app.screen
            assert isinstance(screen, ModelsScreen)
            served = str(screen.query_one("#models-served", Static).render())
            assert "daemon's default: tiny-target" in served and "this chat: tiny-target" in served
            options = screen.query_one("#models-list", OptionList)
            await wait_until(pilot, lambda: options.option_count > 0)
            assert "▶ tiny-target" in str(options.get_option_at_index(0).prompt)
            options.highlighted = screen.names.index("tiny-useless-draft")
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.model == "tiny-useless-draft")
            assert "target tiny-useless-draft" in str(app.query_one("#stats-models").render())
            await type_and_send(pilot, "hello world")
            await wait_until(pilot, lambda: not app.generating and len(app.chat.messages) == 2)
            with d.client() as client:
                assert "tiny-useless-draft" in [m.name for m in client.loaded()]
    finally:
        app.connection.close()
        assert d.stop() == 0, d.log()


async def test_the_models_screen_shows_brackets_in_paths_as_written(
    isolated: Path, tiny_target: Path
) -> None:
    odd = isolated / "[bold]odd[italic].gguf"
    shutil.copy(tiny_target, odd)

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(ModelsScreen(None, odd, None, None))

    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.is_mounted)
        screen = app.screen
        assert isinstance(screen, ModelsScreen)
        served = str(screen.query_one("#models-served", Static).render())
        assert f"saved draft choice (pick-draft): {odd}" in served
        screen._show([odd.stem], {})  # as the daemon would list a model found at that path
        options = screen.query_one("#models-list", OptionList)
        await wait_until(pilot, lambda: options.option_count > 0)
        assert "[bold]odd[italic]" in str(options.get_option_at_index(0).prompt)
