"""The command palette's chat commands: speculation method and k, models, pick-draft, chats, the daemon."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from localspec.printable import printable
from localspec.types import METHODS

if TYPE_CHECKING:
    from tui.app import ChatApp

K_CHOICES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
METHOD_HELP = {
    "auto": "let the daemon choose per request",
    "none": "the target alone (no speculation)",
    "draft": "a small draft model proposes tokens",
    "ngram": "tokens proposed from the conversation's own n-grams",
    "layerskip": "the target's own first layers draft (self-speculation)",
}

Command = tuple[str, Callable[[], object], str]


class ChatCommands(Provider):
    """Commands that act on the chat app; fuzzy-matched as the user types."""

    def commands(self) -> list[Command]:
        app = cast("ChatApp", self.app)
        available = app.health.methods if app.health is not None else ()
        out: list[Command] = []
        for method in METHODS:
            note = "" if method in ("auto", "none") or method in available else " (not loaded on this daemon)"
            out.append((f"Method: {method}", partial(app.set_method, method), METHOD_HELP[method] + note))
        out += [(f"k = {k}", partial(app.set_k, k), f"draft at most {k} tokens per step") for k in K_CHOICES]
        out += [
            (
                printable(f"Model: {name}"),
                partial(app.use_model, name),
                "talk to this model (the daemon loads it)",
            )
            for name in app.served
        ]
        out += [
            ("Models: show or switch", app.action_models, "served target and draft, models on this machine"),
            ("Show pick-draft choice", app.action_pick_draft, "what pick-draft recommends here, and why"),
            (
                f"Draft colouring: turn {'off' if app.colour_drafts else 'on'}",
                app.action_toggle_draft_colours,
                "colour reply text that came from accepted drafts (f2)",
            ),
            ("New chat", app.action_new_chat, "save this chat and start an empty one"),
            ("Resume a saved chat", app.action_open_chat, "pick from the chats saved on this machine"),
            ("System prompt", app.action_system_prompt, "edit this chat's system prompt"),
            ("Retry or reconnect", app.action_retry, "resend the last message, or reach the daemon again"),
            ("Help: keys", app.action_help, "every key the chat answers to"),
        ]
        return out

    async def discover(self) -> Hits:
        for title, command, help_text in self.commands():
            yield DiscoveryHit(title, command, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, command, help_text in self.commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), command, text=title, help=help_text)
