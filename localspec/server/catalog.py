"""The models the daemon serves: its default model and every GGUF `localspec models` finds.

Each gets one stable name: the default model its file's stem (as before), a file in
a models folder its path there without `.gguf`, a Hugging Face file `owner/repo:file`,
an Ollama model Ollama's own name. A file's name (`x.gguf`) and an Ollama-style
`family:size` from its header are aliases where no other model claims them. Names
are compared, never opened as paths: a request can only reach a file the scan listed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localspec.errors import ModelNotFoundError
from localspec.models.discovery import FoundModel
from localspec.models.gguf_info import GGUFInfo
from localspec.server.ollama_info import names_model, ollama_name

# A scan reads every source's folders (headers come from the cache): listings reuse one this recent.
RESCAN_AFTER_S = 5.0


@dataclass(frozen=True)
class ServedModel:
    """One model a request may name."""

    name: str
    path: Path
    info: GGUFInfo
    source: str
    aliases: tuple[str, ...] = field(default=())


Scan = Callable[[], Sequence[FoundModel]]


def _stem(display: str) -> str:
    return display[: -len(".gguf")] if display.lower().endswith(".gguf") else display


def build_catalog(default: ServedModel, found: Sequence[FoundModel]) -> list[ServedModel]:
    """The default model first, then each found file once, with aliases no two models share."""
    models = [default]
    taken = {default.name}
    seen = {_resolved(default.path)}
    for model in found:
        path = _resolved(model.path)
        if path in seen:
            continue
        name = model.display_name if model.source == "ollama" else _stem(model.display_name)
        if name in taken:
            name = model.display_name if model.display_name not in taken else f"{name}@{model.source}"
        if name in taken:
            continue
        seen.add(path)
        taken.add(name)
        models.append(ServedModel(name, model.path, model.info, model.source))
    return _with_aliases(models, taken)


def _with_aliases(models: list[ServedModel], names: set[str]) -> list[ServedModel]:
    wanted: dict[str, list[int]] = {}
    for i, m in enumerate(models):
        for alias in {m.path.name, ollama_name(m.info) or ""} - {"", m.name}:
            wanted.setdefault(alias, []).append(i)
    aliases: dict[int, list[str]] = {}
    for alias, owners in wanted.items():
        if len(owners) == 1 and alias not in names:  # ambiguous aliases name nobody
            aliases.setdefault(owners[0], []).append(alias)
    return [
        ServedModel(m.name, m.path, m.info, m.source, tuple(sorted(aliases.get(i, []))))
        for i, m in enumerate(models)
    ]


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


class ModelCatalog:
    """The served models, rescanned at most every RESCAN_AFTER_S (and on a name it does not know)."""

    def __init__(self, default: ServedModel, scan: Scan, alias: str) -> None:
        self.default = default
        self.alias = alias
        self._scan = scan
        self._lock = threading.Lock()
        self._models: list[ServedModel] = [default]
        self._scanned = float("-inf")

    def models(self, *, fresh: bool = False) -> list[ServedModel]:
        """Every served model, the default first. Blocking (it may scan): call it off the event loop."""
        with self._lock:
            if fresh or time.monotonic() - self._scanned > RESCAN_AFTER_S:
                self._models = build_catalog(self.default, self._scan())
                self._scanned = time.monotonic()
            return list(self._models)

    def resolve(self, name: str | None) -> ServedModel:
        """The model a request names; the default for no name or the daemon's alias. Blocking."""
        if not name:
            return self.default
        found = self._match(self.models(), name)
        if found is None and time.monotonic() - self._scanned > 1.0:
            found = self._match(self.models(fresh=True), name)  # a model pulled since the last scan
        if found is None:
            listed = "GET /v1/models or /api/tags lists them"
            raise ModelNotFoundError(
                f"model {name!r} is not loaded, nor one this daemon can load; {listed}", param="model"
            )
        return found

    def _match(self, models: list[ServedModel], name: str) -> ServedModel | None:
        base = name.removesuffix(":latest")
        if base == self.alias:
            return self.default
        for m in models:
            if base in (m.name, *m.aliases) or name in (m.name, *m.aliases):
                return m
        if ":" not in name:
            return None
        # An Ollama-style `family:tag` with the finetune or quantisation (qwen2.5-coder:1.5b-instruct).
        matches = [m for m in models if names_model(m.info, name)]
        if self.default in matches:
            return self.default
        return matches[0] if len(matches) == 1 else None
