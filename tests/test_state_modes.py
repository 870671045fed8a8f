"""State files that name model paths (config, GGUF and calibration caches, layerskip stamps) are 0600."""

from __future__ import annotations

import stat
from pathlib import Path

from localspec.auto.calibrate import store
from localspec.auto.costmodel import Curve
from localspec.models.gguf_info import read_gguf_info
from localspec.models.layerskip import derive_layerskip_draft
from localspec.paths import Paths
from localspec.settings import save_settings


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


def test_state_files_are_private(tmp_path: Path, tiny_target: Path, localspec_home: Path) -> None:
    cache = tmp_path / "cache"
    read_gguf_info(tiny_target, cache_dir=cache)
    store(cache, {"file": str(tiny_target)}, Curve((0.01, 0.02)))
    derive_layerskip_draft(tiny_target, cache_dir=tmp_path / "derived")
    save_settings({"target": tiny_target})
    files = {**_modes(cache), **_modes(tmp_path / "derived"), **_modes(Paths.from_env().config_dir)}
    json_files = {name: mode for name, mode in files.items() if name.endswith((".json", ".toml"))}
    assert len(json_files) >= 5  # info, tokens, calibration, layerskip stamp, config
    assert set(json_files.values()) == {0o600}, json_files
