"""The benchmark's prompts: read and checked from JSON, in either of its two formats.

The bench set (scripts/bench_set.json, built by scripts/make_bench_set.py) is
`{"prompts": [{"name", "kind", "source", "messages": [{"role", "content"}, ...]}, ...]}`;
the older format, still read, is one object mapping names to user messages (kind "other").
Kinds group the report (median per kind); sources say where each prompt's text came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import UserInputError
from localspec.types import ChatMessage

ROLES = ("system", "user", "assistant")
# The kind given to prompts from the older name -> text format.
UNSORTED = "other"


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a chat ending with the user's turn."""

    name: str
    kind: str
    messages: tuple[ChatMessage, ...]
    source: str = ""

    @classmethod
    def user(cls, name: str, text: str, kind: str = UNSORTED) -> BenchPrompt:
        return cls(name, kind, (ChatMessage("user", text),))


def load_bench_set(path: Path) -> list[BenchPrompt]:
    """The prompts in `path`, in file order; UserInputError (one line) for anything malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read prompts file {path}: {exc}") from None
    return parse_bench_set(data, str(path))


def parse_bench_set(data: Any, where: str = "prompts") -> list[BenchPrompt]:
    """Prompts from parsed JSON in either format (see the module docstring)."""
    if isinstance(data, dict) and isinstance(data.get("prompts"), list):
        prompts = [_entry(item, i, where) for i, item in enumerate(data["prompts"])]
    elif isinstance(data, dict) and data and all(isinstance(v, str) for v in data.values()):
        prompts = [BenchPrompt.user(name, text) for name, text in data.items()]
    else:
        raise UserInputError(
            f'{where} must be {{"prompts": [{{"name", "kind", "messages"}}, ...]}} '
            "or a JSON object mapping names to prompt strings"
        )
    if not prompts:
        raise UserInputError(f"{where} holds no prompts")
    seen: set[str] = set()
    for p in prompts:
        if p.name in seen:
            raise UserInputError(f"{where}: prompt name {p.name!r} appears twice")
        seen.add(p.name)
    return prompts


def load_selected(path: Path, kinds: str = "") -> list[BenchPrompt]:
    """The set at `path`, only the kinds named in `kinds` (comma-separated; empty: all)."""
    prompts = load_bench_set(path)
    wanted = [k.strip() for k in kinds.split(",") if k.strip()]
    return select_kinds(prompts, wanted) if wanted else prompts


def select_kinds(prompts: Sequence[BenchPrompt], kinds: Iterable[str]) -> list[BenchPrompt]:
    """The prompts of the given kinds, in order; UserInputError naming a kind the set lacks."""
    wanted = list(dict.fromkeys(kinds))
    present = list(dict.fromkeys(p.kind for p in prompts))
    missing = [k for k in wanted if k not in present]
    if missing:
        raise UserInputError(
            f"no prompts of kind {', '.join(missing)}; this set has {', '.join(present)}", param="kinds"
        )
    return [p for p in prompts if p.kind in wanted]


def _entry(item: Any, index: int, where: str) -> BenchPrompt:
    if not isinstance(item, dict):
        raise UserInputError(f"{where}: prompt {index} must be an object")
    label = f"{where}: prompt {index} ({item.get('name', 'unnamed')})"
    for key in ("name", "kind"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise UserInputError(f"{label}: {key!r} must be a non-empty string")
    source = item.get("source", "")
    if not isinstance(source, str):
        raise UserInputError(f"{label}: 'source' must be a string")
    return BenchPrompt(item["name"], item["kind"], _messages(item.get("messages"), label), source)


def _messages(raw: Any, label: str) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise UserInputError(f"{label}: 'messages' must be a non-empty list")
    messages = []
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UserInputError(
                f"{label}: each message needs a role ({', '.join(ROLES)}) and a string content"
            )
        messages.append(ChatMessage(m["role"], m["content"]))
    if messages[-1].role != "user":
        raise UserInputError(f"{label}: the last message must be the user's")
    return tuple(messages)
