"""How the API behaves, fixed when the daemon starts: a plain config that imports no engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.server.security import DEFAULT_MAX_BODY_BYTES
from localspec.settings import STREAM_INTERVAL_MS

RETRY_AFTER_S = 2

STREAM_INTERVAL_S = STREAM_INTERVAL_MS / 1000  # the setting's default, for APIs built without settings


MODEL_ALIAS = "localspec"


@dataclass(frozen=True)
class ApiConfig:
    """How the API behaves, fixed when the daemon starts."""

    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    alias: str = MODEL_ALIAS
    pick: str | None = None  # what pick-draft chose for the daemon and why (/health)
    embed_model: Path | None = None  # the embedding GGUF the embeddings routes load on first use
    n_threads: int | None = None  # CPU threads for the embedding model
    n_ctx: int = 4096  # the context models load with, reported for models not loaded yet
    stream_interval_s: float = STREAM_INTERVAL_S  # 0: each chunk goes out as it is made
