"""The models on this machine, as `localspec models --json` lists them.

Read through the CLI in a subprocess: discovery reads GGUF headers, which the
TUI keeps out of its own process (it imports only the client and shared types).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import DaemonError
from localspec.printable import printable

LIST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    params: int
    quant: str
    size_bytes: int
    source: str
    tokenizer: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelEntry:
        return cls(
            name=str(data.get("display_name") or data.get("name") or data["path"]),
            path=Path(data["path"]),
            params=int(data.get("n_params") or 0),
            quant=str(data.get("quant") or "?"),
            size_bytes=int(data.get("size_bytes") or 0),
            source=str(data.get("source") or "?"),
            tokenizer=str(data.get("tokenizer_fingerprint") or "")[:8],
        )

    def label(self) -> str:
        params = f"{self.params / 1e9:.1f}B" if self.params >= 1e8 else f"{self.params / 1e6:.0f}M"
        label = f"{self.name}  {params} {self.quant}  {self.size_bytes / (1 << 20):.0f} MB  ({self.source})"
        return printable(label)  # names come from GGUF headers and hub file names


def list_models(timeout: float = LIST_TIMEOUT_S) -> list[ModelEntry]:
    argv = [sys.executable, "-c", "from localspec.cli import main; main()", "models", "--json"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DaemonError(f"listing the models took over {timeout:g} s") from None
    if done.returncode != 0:
        raise DaemonError(f"`localspec models` failed: {done.stderr.strip().splitlines()[-1:]}")
    return [ModelEntry.from_dict(m) for m in json.loads(done.stdout or "[]")]
