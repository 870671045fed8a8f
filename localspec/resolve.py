"""Which model files to load: from the settings, else the catalog's defaults in the models folder."""

from __future__ import annotations

from pathlib import Path

from localspec.backend import LoadOptions
from localspec.catalog import load_catalog
from localspec.engine import EngineConfig
from localspec.errors import ModelFileError
from localspec.paths import Paths
from localspec.settings import Settings


def target_path(settings: Settings, paths: Paths) -> Path:
    """The target GGUF: --target / LOCALSPEC_TARGET / config.toml, else the catalog's default."""
    if settings.target is not None:
        return settings.target.expanduser()
    catalog = load_catalog()
    default = paths.models_dir / catalog.get(catalog.default_target).file
    if not default.is_file():
        raise ModelFileError(
            f"no target model given and the default ({default.name}) is not in {paths.models_dir}; "
            "pass --target FILE, or run scripts/fetch-models"
        )
    return default


def draft_path(settings: Settings, paths: Paths, target: Path) -> Path | None:
    """The draft GGUF: as configured, else the catalog's paired draft when it is on disk."""
    if settings.draft is not None:
        return settings.draft.expanduser()
    catalog = load_catalog()
    files = {name: model.file for name, model in catalog.models.items()}
    for target_name, draft_name in catalog.pairs:
        candidate = paths.models_dir / files[draft_name]
        if target.name == files[target_name] and candidate.is_file():
            return candidate
    return None


def engine_config(settings: Settings, paths: Paths | None = None) -> EngineConfig:
    """The EngineConfig every interface (generate, bench, serve, chat) loads with."""
    paths = paths or Paths.from_env()
    target = target_path(settings, paths)
    return EngineConfig(
        target=target,
        draft=draft_path(settings, paths, target),
        method=settings.method,
        k=settings.k,
        load=LoadOptions(
            n_ctx=settings.n_ctx,
            n_threads=settings.threads,
            gpu_layers=settings.gpu_layers,
            kv_type=settings.kv_type,
        ),
        draft_gpu_layers=settings.draft_gpu_layers,
        queue_size=settings.queue_size,
    )
