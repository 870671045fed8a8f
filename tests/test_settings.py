"""Settings: flags over environment over config.toml over defaults; saving merges and removes."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.errors import ConfigError
from localspec.paths import Paths
from localspec.settings import load_settings, save_settings


def test_precedence_flags_env_file_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    save_settings({"k": 6, "n_ctx": 1024, "method": "ngram"})
    assert load_settings().k == 6
    monkeypatch.setenv("LOCALSPEC_K", "3")
    settings = load_settings(k=None)
    assert (settings.k, settings.n_ctx, settings.method) == (3, 1024, "ngram")
    assert load_settings(k=8).k == 8
    assert load_settings().queue_size == 16
    assert load_settings().exact is False  # llama.cpp's own loading unless --exact
    monkeypatch.setenv("LOCALSPEC_EXACT", "true")
    assert load_settings().exact is True and load_settings(exact=False).exact is False


def test_saving_none_removes_a_key(localspec_home: Path) -> None:
    save_settings({"draft": Path("/models/d.gguf"), "k": 4})
    assert load_settings().draft == Path("/models/d.gguf")
    path = save_settings({"draft": None, "method": "none"})
    assert path == Paths.from_env().config_file
    settings = load_settings()
    assert settings.draft is None and settings.method == "none" and settings.k == 4
    assert "draft" not in path.read_text()


def test_bad_values_are_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_METHOD", "telepathy")
    with pytest.raises(ConfigError, match="invalid settings"):
        load_settings()


def test_a_broken_config_file_is_a_clear_error() -> None:
    config = Paths.from_env().config_file
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("k = [unclosed\n")
    with pytest.raises(ConfigError, match="invalid settings"):
        load_settings()
