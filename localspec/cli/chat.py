"""`localspec chat`: the terminal chat UI, on the running daemon or one started for the session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from localspec.cli.app import cli
from localspec.cli.options import model_options, pop_model_settings

if TYPE_CHECKING:
    from localspec.settings import Settings
    from tui.chats import ChatStore


@cli.command("chat")
@model_options
@click.option(
    "--resume",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ID]",
    help="Resume a saved chat by id (or a unique prefix); without ID, pick from a list.",
)
@click.option("--list", "list_chats", is_flag=True, help="List the saved chats and exit.")
@click.option("--max-tokens", type=click.IntRange(1), default=1024, show_default=True, help="Per reply.")
def chat_command(resume: str | None, list_chats: bool, max_tokens: int, **kwargs: Any) -> None:
    """Chat in the terminal, with live tokens/s and speculation stats.

    Uses the daemon running on its socket; if none runs, starts one for this
    session with the model flags given here (on a private socket, stopped on
    exit). Enter sends, ctrl+j adds a line, Esc stops a reply, F1 lists the keys.
    """
    from localspec.paths import Paths
    from localspec.settings import load_settings
    from tui.chats import ChatStore

    settings = load_settings(**pop_model_settings(kwargs))
    store = ChatStore(Paths.from_env().chats_dir)
    if list_chats:
        _print_chats(store)
        return
    if resume:
        store.load(resume)  # an unknown id fails here, before any daemon is started
    _run(settings, store, resume, max_tokens)


def _run(settings: Settings, store: ChatStore, resume: str | None, max_tokens: int) -> None:
    from tui.app import make_app
    from tui.connection import find_or_start

    connection = find_or_start(settings)
    click.echo(f"localspec chat: using {connection.describe()}", err=True)
    app = None
    try:
        app = make_app(
            settings,
            connection.client,
            session=connection.session,
            store=store,
            resume=resume,
            max_tokens=max_tokens,
        )
        app.run()
    finally:
        # The app may have replaced the connection's daemon while recovering: close the one it holds.
        final = app.connection if app is not None else connection
        final.close()
        if final.session is not None:
            click.echo("localspec chat: stopped the daemon started for this chat", err=True)


def _print_chats(store: ChatStore) -> None:
    import time

    chats = store.saved()
    if not chats:
        click.echo("no saved chats", err=True)
    for chat in chats:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
        click.echo(f"{chat.id}  {when}  {len(chat.messages):3d} msgs  {chat.title}")
