"""Settings: flags over environment over config.toml over defaults; saving merges and removes."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.errors import ConfigError
from localspec.paths import Paths
from localspec.settings import load_settings, load_settings_reading, save_settings


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


def test_a_bad_value_is_named_with_where_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    config = Paths.from_env().config_file
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('k = 0\nkeep_alive = "forever"\n')
    monkeypatch.setenv("LOCALSPEC_METHOD", "telepathy")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = raised.value.message
    assert "k = 0: Input should be greater than or equal to 1" in message
    assert "keep_alive = 'forever': keep_alive 'forever' is neither" in message
    assert "method = 'telepathy'" in message and "change or unset LOCALSPEC_METHOD" in message
    assert message.count(f"fix or remove it in {config}") == 1 and "\n" not in message


def test_a_command_that_reads_some_fields_runs_beside_a_bad_other(monkeypatch: pytest.MonkeyPatch) -> None:
    config = Paths.from_env().config_file
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('k = 0\nsocket = "/tmp/x.sock"\nqueue_size = 3\n[drafts]\na = 1\nb = 2\n')
    settings = load_settings_reading(("socket",))
    assert settings.socket == Path("/tmp/x.sock") and settings.k is None and settings.queue_size == 3
    assert settings.drafts == {}
    monkeypatch.setenv("LOCALSPEC_QUEUE_SIZE", "0")
    assert load_settings_reading(("socket",)).queue_size == 16  # a bad environment value too
    with pytest.raises(ConfigError, match="k = 0"):
        load_settings_reading(("socket", "k"))
    with pytest.raises(ConfigError, match="k = 0"):
        load_settings()
