"""The one atomic small-file writer that settings, caches, stamps and saved chats share."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from localspec.atomicfile import write_text_atomic


def test_writes_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write_text_atomic(path, "a = 1\n")
    write_text_atomic(path, "é = 2\n")
    assert path.read_text(encoding="utf-8") == "é = 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_a_private_file_is_private_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    write_text_atomic(path, "{}", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_and_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    write_text_atomic(path, "old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "half \ud800 written")  # a lone surrogate cannot be UTF-8
    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]
