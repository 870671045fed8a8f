"""Every place localspec reads or writes, decided in one spot.

Standard library only: `scripts/fetch-models` uses it before any dependency is
installed. `LOCALSPEC_HOME` moves all state (config, caches, sockets, saved
chats) under one folder, which is how tests keep away from the real home;
`LOCALSPEC_MODELS` moves the models folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

APP = "localspec"


def checkout_root() -> Path | None:
    """The source checkout this package runs from, or None when installed normally."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "models" / "catalog.toml").is_file():
        return root
    return None


def _xdg(env: Mapping[str, str], var: str, fallback: str) -> Path:
    value = env.get(var)
    if value:
        return Path(value)
    home = Path(env.get("HOME") or Path.home())
    if sys.platform == "darwin":
        return home / "Library" / "Application Support"
    return home / fallback


@dataclass(frozen=True)
class Paths:
    """Resolved folders and files for one process."""

    config_dir: Path
    state_dir: Path
    cache_dir: Path
    runtime_dir: Path
    models_dir: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Paths:
        env = os.environ if env is None else env
        home = env.get("LOCALSPEC_HOME")
        if home:
            base = Path(home).expanduser()
            config, state, cache, runtime = base, base / "state", base / "cache", base / "run"
            data = base / "data"
        else:
            config = _xdg(env, "XDG_CONFIG_HOME", ".config") / APP
            state = _xdg(env, "XDG_STATE_HOME", ".local/state") / APP
            cache = _xdg(env, "XDG_CACHE_HOME", ".cache") / APP
            data = _xdg(env, "XDG_DATA_HOME", ".local/share") / APP
            xdg_runtime = env.get("XDG_RUNTIME_DIR")
            runtime = Path(xdg_runtime) / APP if xdg_runtime else state / "run"
        return cls(
            config_dir=config,
            state_dir=state,
            cache_dir=cache,
            runtime_dir=runtime,
            models_dir=_models_dir(env, data),
        )

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def socket_path(self) -> Path:
        return self.runtime_dir / "localspec.sock"

    @property
    def pid_file(self) -> Path:
        return self.runtime_dir / "localspec.pid"

    @property
    def chats_dir(self) -> Path:
        return self.state_dir / "chats"

    @property
    def derived_models_dir(self) -> Path:
        """Where derived GGUFs (layer-skip drafts) are cached, keyed by the target's hash."""
        return self.cache_dir / "derived"


def _models_dir(env: Mapping[str, str], data_dir: Path) -> Path:
    override = env.get("LOCALSPEC_MODELS")
    if override:
        return Path(override).expanduser()
    root = checkout_root()
    if root is not None:
        return root / "models"
    return data_dir / "models"
