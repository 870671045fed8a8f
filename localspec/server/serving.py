"""What the daemon serves, put together from the settings: the catalog, the budget and the pool.

The default model (--target, else the catalog's default) loads at start, as it always
has; every other model `localspec models` finds loads on its first request, with the
draft pinned for it in the settings (`drafts`) or, without a pin, the one pick-draft
chooses for that target on this machine (saved per target and machine: pickdraft.saved).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from localspec.engine.config import EngineConfig
from localspec.engine.worker import Engine
from localspec.keepalive import parse_keep_alive
from localspec.models.discovery import FoundModel, discover
from localspec.models.gguf_info import read_gguf_info
from localspec.paths import Paths
from localspec.pickdraft.devices import DeviceMemory, parse_size
from localspec.pickdraft.memplan import MemoryPlanError
from localspec.resolve import model_serve_config
from localspec.server.budget import Footprint, Probe, Room, footprint, live_memory
from localspec.server.catalog import ModelCatalog, ServedModel
from localspec.server.pool import Loadout, ModelPool, Resident
from localspec.settings import Settings, load_settings

log = logging.getLogger("localspec.daemon")
ROOMY = 1 << 50  # a machine the plan always fits, to read a model's footprint off it


@dataclass(frozen=True)
class ServeOptions:
    """The settings serve needs beyond the default model's engine config."""

    settings: Settings | None = None  # None: load_settings() when a model loads
    keep_alive: float | None = 300.0  # seconds an on-demand model stays after its last request
    max_resident: int | None = None  # bytes the loaded models may take together (the setting)
    pins: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> ServeOptions:
        cap = parse_size(settings.max_resident) if settings.max_resident else None
        return cls(settings, parse_keep_alive(settings.keep_alive), cap, dict(settings.drafts))


def draft_pin(pins: dict[str, str], model: ServedModel) -> str | None:
    """The draft the settings pin for this model: by its served name, file name or file stem."""
    for key in (model.name, model.path.name, model.path.stem):
        if key in pins:
            return pins[key]
    return None


def default_model(target: Path, cache_dir: Path | None) -> ServedModel:
    return ServedModel(target.stem, target, read_gguf_info(target, cache_dir=cache_dir), "target")


@dataclass
class Served:
    """The catalog, the pool, and the default model's entry in it (loading)."""

    catalog: ModelCatalog
    pool: ModelPool
    default: Resident


def build(
    engine: EngineConfig,
    pick: str | None,
    options: ServeOptions,
    make_engine: Callable[[EngineConfig], Engine],
    alias: str,
    probe: Probe = live_memory,
) -> Served:
    """Start loading the default model (`engine`) and set up the rest to load on demand. Blocking.

    `probe` reads the machine's memory: here for the default model, and again at each load.
    """
    paths = Paths.from_env()
    device = probe()
    default = default_model(engine.target, engine.cache_dir)

    def scan() -> list[FoundModel]:
        return discover(cache_dir=paths.cache_dir).models

    def prepare(model: ServedModel, now: DeviceMemory) -> Loadout:
        if model.path == default.path:
            return Loadout(engine, pick, _default_footprint(engine, now))
        pin = draft_pin(options.pins, model)
        config, why = model_serve_config(settings, model.path, pin, paths, memory=now)
        return Loadout(config, why, footprint(config, now))

    def keep_alive(model: ServedModel) -> float | None:
        # The model the daemon was started for stays, as it always has, unless a request says otherwise.
        return None if model.path == default.path else options.keep_alive

    settings = options.settings or load_settings()
    catalog = ModelCatalog(default, scan, alias)
    room = Room(probe, options.max_resident)
    pool = ModelPool(prepare, make_engine, room, keep_alive)
    loadout = Loadout(engine, pick, _default_footprint(engine, device))
    # The plan was applied above (and may be overruled for this model); a cap the person set is not.
    if options.max_resident is not None and loadout.footprint.total > options.max_resident:
        raise room.budget(device).refuse(default.name, loadout.footprint)
    resident = pool.adopt(default, loadout, make_engine(engine))
    return Served(catalog, pool, resident)


def _default_footprint(engine: EngineConfig, device: DeviceMemory) -> Footprint:
    """The default model's footprint; one the plan says cannot fit still loads, as it always has.

    The plan is conservative (reserves, worst-case buffers): where it refuses the model the
    person chose to serve, llama.cpp is left to try, and the pool counts what the plan says.
    """
    try:
        return footprint(engine, device)
    except MemoryPlanError as exc:
        log.warning("%s; loading it anyway", exc.message)
        roomy = replace(device, ram_total=ROOMY, ram_available=ROOMY)
        return footprint(engine, roomy)
