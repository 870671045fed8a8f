"""What the daemon has loaded, as `GET /api/ps` reports it: `localspec ps` and the TUI read these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoadedModel:
    """One loaded (or loading) model: its memory by the plan, its draft, and when it unloads."""

    name: str
    size: int  # bytes: weights, KV cache and compute buffers of the model and its draft
    size_vram: int
    expires_at: str  # ISO 8601; 9999-… for a model kept until the daemon stops
    context_length: int
    draft: str | None = None
    method: str | None = None
    status: str = "ready"
    busy: int = 0
    saved_prompt_bytes: int = 0  # conversations' caches kept beside `size`

    @property
    def kept(self) -> bool:
        return self.expires_at.startswith("9999")

    @classmethod
    def from_ps(cls, entry: dict[str, Any]) -> LoadedModel:
        return cls(
            name=str(entry.get("name", "")).removesuffix(":latest"),
            size=int(entry.get("size") or 0),
            size_vram=int(entry.get("size_vram") or 0),
            expires_at=str(entry.get("expires_at") or ""),
            context_length=int(entry.get("context_length") or 0),
            draft=entry.get("draft"),
            method=entry.get("method"),
            status=str(entry.get("status") or "ready"),
            busy=int(entry.get("busy") or 0),
            saved_prompt_bytes=int(entry.get("saved_prompt_bytes") or 0),
        )
