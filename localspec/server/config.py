"""How the API behaves, fixed when the daemon starts: a plain config that imports no engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.server.security import DEFAULT_MAX_BODY_BYTES

RETRY_AFTER_S = 2

# How long a streamed reply's chunks may gather before they go out together (Handle.gather): at
# 40 ms a CPU-bound 1.5B at ~40 tok/s sends about every other token, its Python time per step
# falls 0.06 ms and its decode gains ~1% on 2 cores (docs/benchmarks.md, session 39), and text
# still arrives 25 times a second.
STREAM_INTERVAL_S = 0.04


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
