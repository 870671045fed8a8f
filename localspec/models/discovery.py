"""Find GGUF models already on this machine, wherever other tools put them.

Sources, in the order a file is credited to when several hold it: localspec's own
models folder, extra search paths, the Hugging Face cache (snapshots), LM Studio's
folders, and Ollama's blob store (read through its manifests, since the blobs carry
no names). Files are de-duplicated by resolved path, so a HF snapshot symlink and
its blob count once. A file that cannot be read is reported as skipped with its
reason; it never stops the scan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from localspec.errors import LocalspecError
from localspec.models.gguf_info import GGUFInfo, read_gguf_info
from localspec.models.split import is_first_part
from localspec.paths import Paths

Source = Literal["models", "search-path", "huggingface", "lmstudio", "ollama"]
OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
OLLAMA_DEFAULT_REGISTRY = "registry.ollama.ai"


@dataclass(frozen=True)
class Candidate:
    """A file that looks like a model, before it is read."""

    path: Path
    source: Source
    display_name: str


@dataclass(frozen=True)
class FoundModel:
    """A readable model: where it came from and what its header says."""

    path: Path
    source: Source
    display_name: str
    info: GGUFInfo


@dataclass(frozen=True)
class Skipped:
    """A candidate that could not be used, and why (one line)."""

    path: Path
    source: Source
    display_name: str
    reason: str


@dataclass
class Discovery:
    models: list[FoundModel] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def discover(
    search_paths: Sequence[Path] = (),
    *,
    env: Mapping[str, str] | None = None,
    cache_dir: Path | None = None,
) -> Discovery:
    """Scan every source, read each GGUF's header (cached), and sort the results by name."""
    env = os.environ if env is None else env
    result = Discovery()
    cache = cache_dir or Paths.from_env(env).cache_dir
    for cand in find_candidates(search_paths, env=env):
        try:
            info = read_gguf_info(cand.path, cache_dir=cache)
        except LocalspecError as exc:
            result.skipped.append(Skipped(cand.path, cand.source, cand.display_name, exc.message))
            continue
        except Exception as exc:  # a file the reader failed on must cost that file, never the list
            reason = f"{cand.path}: unreadable ({type(exc).__name__}: {exc})"
            result.skipped.append(Skipped(cand.path, cand.source, cand.display_name, reason))
            continue
        result.models.append(FoundModel(cand.path, cand.source, cand.display_name, info))
    result.models.sort(key=lambda m: (m.display_name.lower(), str(m.path)))
    return result


def find_candidates(
    search_paths: Sequence[Path] = (), *, env: Mapping[str, str] | None = None
) -> list[Candidate]:
    """Every model-looking file from every source, first source wins for a resolved path."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    sources: list[Iterator[Candidate]] = [
        _folder(Paths.from_env(env).models_dir, "models"),
        *(_folder(Path(p).expanduser(), "search-path") for p in search_paths),
        _huggingface(hf_hub_cache(env, home)),
        *(_folder(root, "lmstudio") for root in lmstudio_roots(home)),
        _ollama(ollama_root(env, home)),
    ]
    seen: set[Path] = set()
    out: list[Candidate] = []
    for source in sources:
        for cand in source:
            try:
                resolved = cand.path.resolve()
            except OSError:
                resolved = cand.path
            if resolved in seen:
                continue
            seen.add(resolved)
            out.append(cand)
    return out


def hf_hub_cache(env: Mapping[str, str], home: Path) -> Path:
    """The hub cache folder as huggingface_hub computes it (HF_HUB_CACHE, HF_HOME, XDG)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else home / ".cache"
    return base / "huggingface" / "hub"


def lmstudio_roots(home: Path) -> list[Path]:
    """LM Studio's models folders: the current one and the pre-0.3 one."""
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def ollama_root(env: Mapping[str, str], home: Path) -> Path:
    """Ollama's models folder (holding manifests/ and blobs/); OLLAMA_MODELS moves it."""
    override = env.get("OLLAMA_MODELS")
    return Path(override).expanduser() if override else home / ".ollama" / "models"


def _folder(root: Path, source: Source) -> Iterator[Candidate]:
    """`root` itself when it is a file, else every *.gguf below it (hidden folders skipped)."""
    if root.is_file():
        yield Candidate(root, source, root.name)
        return
    for path in _walk_gguf(root):
        yield Candidate(path, source, _relative_name(path, root))


def _walk_gguf(root: Path) -> Iterator[Path]:
    visited: set[str] = set()
    # onerror=None: unreadable folders are passed over silently, as `find` would with 2>/dev/null.
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in visited:  # a symlink loop, or two links to one folder
            dirs.clear()
            continue
        visited.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.lower().endswith(".gguf") and not name.startswith(".") and is_first_part(name):
                yield Path(folder) / name


def _relative_name(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return path.name


def _huggingface(cache: Path) -> Iterator[Candidate]:
    """GGUFs in hub snapshots: models--owner--name/snapshots/<rev>/<file>, named owner/name:file."""
    try:
        repos = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        return
    for repo_dir in repos:
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/")
        snapshots = repo_dir / "snapshots"
        for path in _walk_gguf(snapshots):
            inner = path.relative_to(snapshots)
            # The first part is the revision hash; the rest is the file's path in the repository.
            yield Candidate(path, "huggingface", f"{repo_id}:{Path(*inner.parts[1:])}")


def _ollama(root: Path) -> Iterator[Candidate]:
    """Model blobs named by their manifests: manifests/<registry>/<ns>/<model>/<tag>."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for folder, dirs, files in os.walk(manifests):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for tag in sorted(files):
            manifest = Path(folder) / tag
            blob = _ollama_model_blob(manifest, root)
            if blob is not None:
                yield Candidate(blob, "ollama", _ollama_name(manifest.relative_to(manifests)))


def _ollama_model_blob(manifest: Path, root: Path) -> Path | None:
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL_MEDIA_TYPE:
            continue
        digest = str(layer.get("digest", ""))
        if digest.startswith("sha256:"):
            return root / "blobs" / digest.replace(":", "-", 1)
    return None


def _ollama_name(relative: Path) -> str:
    """model:tag for the default registry's library, ns/model:tag or host/ns/model:tag otherwise."""
    parts = relative.parts
    if len(parts) < 3:
        return str(relative)
    *prefix, model, tag = parts
    if prefix[0] == OLLAMA_DEFAULT_REGISTRY:
        prefix = prefix[1:]
        if prefix == ["library"]:
            prefix = []
    return "/".join([*prefix, model]) + f":{tag}"
