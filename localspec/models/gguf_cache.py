"""The on-disk cache of what GGUF headers say, so a second scan of a folder only stats files.

Infos are keyed by (resolved path, size, mtime_ns), so a file rewritten in place is
read again; token lists are keyed by tokenizer fingerprint, so models that share a
vocabulary share one entry. Entries are JSON files written atomically. A cache that
cannot be read or written only costs speed, so its errors are swallowed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from localspec.atomicfile import write_text_atomic

# Bump when GGUFInfo, the cached token format or the parser's output changes, so old entries are ignored.
CACHE_VERSION = 4


def cache_key(file: Path, st: os.stat_result) -> str:
    """The key of one file's info: changes whenever the file is replaced or rewritten."""
    raw = f"v{CACHE_VERSION}\0{file}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:32]


class GGUFCache:
    """Info dicts by file key and token lists by fingerprint, under `<cache_dir>/gguf/v<N>/`."""

    def __init__(self, cache_dir: Path) -> None:
        self.root = cache_dir / "gguf" / f"v{CACHE_VERSION}"

    def load_info(self, key: str) -> dict[str, Any] | None:
        data = _load(self.root / "info" / f"{key}.json")
        return data if isinstance(data, dict) else None

    def load_tokens(self, fingerprint: str) -> list[str] | None:
        data = _load(self.root / "tokens" / f"{fingerprint}.json")
        return data if isinstance(data, list) else None

    def store(self, key: str, info: dict[str, Any], fingerprint: str, tokens: list[str]) -> None:
        self.store_tokens(fingerprint, tokens)
        _write(self.root / "info" / f"{key}.json", info)

    def store_tokens(self, fingerprint: str, tokens: list[str]) -> None:
        tokens_file = self.root / "tokens" / f"{fingerprint}.json"
        if not tokens_file.is_file():
            _write(tokens_file, tokens)


def _load(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write(file: Path, data: Any) -> None:
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # ensure_ascii escapes lone surrogates, which plain UTF-8 could not encode.
        write_text_atomic(file, json.dumps(data, ensure_ascii=True))
    except OSError:
        pass  # a cache that cannot be written is read again next time
