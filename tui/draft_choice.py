"""What pick-draft would choose for the served target, as `localspec pick-draft --json` reports it.

Run through the CLI in a subprocess, like the model list: pick-draft reads GGUF
headers and plans memory (its fast path loads no weights), and the TUI keeps
that out of its own process. The daemon's /health names its target by file name
only, so the file is found first: the model flags this chat was given, else the
models `localspec models` finds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import DaemonError

PICK_TIMEOUT_S = 120.0
TOP = 5  # candidates shown


@dataclass(frozen=True)
class CandidateLine:
    label: str
    method: str
    speedup: float | None
    k: int | None
    usable: bool
    reason: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateLine:
        usable = bool(data.get("compatible") and data.get("fits") and not data.get("pull"))
        speedup = data.get("expected_speedup")
        return cls(
            label=str(data.get("label") or data.get("method")),
            method=str(data.get("method")),
            speedup=float(speedup) if speedup is not None else None,
            k=data.get("k"),
            usable=usable,
            reason=str(data.get("reason") or ""),
        )

    def text(self) -> str:
        speed = f"{self.speedup:.2f}x" if self.speedup is not None else "  -  "
        k = f"k={self.k}" if self.k else "   "
        mark = " " if self.usable else "✗"
        return f"{mark} {speed} {k:<4} {self.label} ({self.method}): {self.reason}"


@dataclass(frozen=True)
class DraftChoice:
    """pick-draft's choice for one target, its reason, and the best-ranked candidates."""

    target: str
    device: str
    method: str
    draft: str | None
    k: int
    speedup: float
    reason: str
    candidates: tuple[CandidateLine, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftChoice:
        choice = data["choice"]
        return cls(
            target=Path(data["target"]).name,
            device=str(data.get("device") or "?"),
            method=str(choice["method"]),
            draft=Path(choice["draft"]).name if choice.get("draft") else None,
            k=int(choice.get("k") or 0),
            speedup=float(choice.get("expected_speedup") or 1.0),
            reason=str(choice.get("reason") or ""),
            candidates=tuple(CandidateLine.from_dict(c) for c in data.get("candidates", [])[:TOP]),
        )

    def summary(self) -> str:
        what = self.method + (f" with {self.draft}" if self.draft else "")
        return f"{what}, k={self.k}, expected {self.speedup:.2f}x"


def served_path(name: str, known: list[Path], found: list[Path]) -> Path | None:
    """The file of the target the daemon names: one of the paths this chat knows, else one found."""
    for path in (*known, *found):
        if path.name == name:
            return path
    return None


def pick_draft(target: Path, n_ctx: int | None = None, timeout: float = PICK_TIMEOUT_S) -> DraftChoice:
    """`localspec pick-draft --json` for `target`; DaemonError when it fails."""
    argv = [sys.executable, "-c", "from localspec.cli import main; main()", "pick-draft", "--json"]
    argv += ["--target", str(target)]
    if n_ctx:
        argv += ["--ctx", str(n_ctx)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DaemonError(f"pick-draft took over {timeout:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DaemonError(f"`localspec pick-draft` failed: {last}")
    try:
        return DraftChoice.from_dict(json.loads(done.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        raise DaemonError(f"`localspec pick-draft --json` printed something unexpected: {exc}") from None
