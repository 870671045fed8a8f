"""Ollama's keep_alive: how long a model stays loaded after its last request.

A number is seconds; a string is a number or a Go duration ("30s", "5m", "1h30m");
0 unloads the model as soon as its requests end; any negative value keeps it
loaded until the daemon stops. `parse_keep_alive` returns seconds, or None for "forever".
"""

from __future__ import annotations

import re

from localspec.errors import UserInputError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def parse_keep_alive(value: float | str) -> float | None:
    """Seconds to stay loaded after the last request; None to stay until the daemon stops."""
    if isinstance(value, bool):
        raise UserInputError(f"keep_alive {value!r} is neither a number of seconds nor a duration like 5m")
    if isinstance(value, int | float):
        return None if value < 0 else float(value)
    text = value.strip()
    if _NUMBER.match(text):
        return parse_keep_alive(float(text))
    negative = text.startswith("-")
    body = text.removeprefix("-")
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise UserInputError(f"keep_alive {value!r} is neither a number of seconds nor a duration like 5m")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    return None if negative and seconds > 0 else seconds


def describe_keep_alive(seconds: float | None) -> str:
    """'until stopped', 'unload when idle' or '5m', for people."""
    if seconds is None:
        return "until stopped"
    if seconds == 0:
        return "unload when idle"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:g}s"
