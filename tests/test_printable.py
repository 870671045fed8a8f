"""Strings from GGUF headers, file names and the hub reach the terminal with control characters escaped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import hostilegguf
import pytest

from localspec.client import Health
from localspec.printable import printable
from tui.model_list import ModelEntry
from tui.screens.models import served_text

ESC = "\x1b"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain é 😀 名前", "plain é 😀 名前"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("bell\x07 tab\t nl\n cr\r del\x7f", "bell\\x07 tab\\x09 nl\\x0a cr\\x0d del\\x7f"),
        ("c1 \x9b31m", "c1 \\x9b31m"),
        ("\u202etxt.exe", "\\u202etxt.exe"),
        ("\u2066iso\u2069 ls\u2028", "\\u2066iso\\u2069 ls\\u2028"),
        ("raw \udcff byte", "raw \\udcff byte"),
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from localspec.cli import main; main()", *args]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, errors="surrogateescape"
    )


@pytest.fixture
def escaped_models(tmp_path: Path) -> Path:
    """A folder with a model whose header name holds escapes, and one whose file name does."""
    folder = tmp_path / "shared"
    folder.mkdir()
    hostilegguf.write_escaped_name(folder / "named.gguf")
    shutil.copy(folder / "named.gguf", folder / f"file{ESC}]0;title{hostilegguf.ESCAPES[-2:]}.gguf")
    (folder / f"broken{ESC}[2J.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    return folder


def test_models_and_its_skipped_lines_escape_names(escaped_models: Path, isolated: Path) -> None:
    done = _cli("models", "--search-path", str(escaped_models))
    assert done.returncode == 0, done.stderr
    assert ESC not in done.stdout and ESC not in done.stderr
    assert "file\\x1b]0;title" in done.stdout
    assert "broken\\x1b[2J.gguf" in done.stderr


def test_models_json_keeps_the_true_names(escaped_models: Path, isolated: Path) -> None:
    done = _cli("models", "--json", "--search-path", str(escaped_models))
    assert ESC not in done.stdout  # JSON writes control characters as \u escapes
    names = {row["name"] for row in json.loads(done.stdout)}
    assert "evil" + hostilegguf.ESCAPES in names


def test_inspect_escapes_header_fields(escaped_models: Path) -> None:
    done = _cli("inspect", str(escaped_models / "named.gguf"))
    assert done.returncode == 0, done.stderr
    assert ESC not in done.stdout and "\x07" not in done.stdout
    name_line = next(line for line in done.stdout.splitlines() if line.startswith("name:"))
    assert name_line.endswith(
        "evil\\x1b[2J\\x1b]0;pwned\\x07\\x1b]8;;http://x\\x1b\\link\\x1b]8;;\\x1b\\\\x0d\\x08"
    )


def test_error_lines_escape_what_they_quote(tmp_path: Path) -> None:
    done = _cli("inspect", str(tmp_path / f"gone{ESC}[31m.gguf"))
    assert done.returncode == 2
    assert ESC not in done.stderr and "gone\\x1b[31m.gguf: no such file" in done.stderr


def test_the_tui_shows_names_escaped() -> None:
    entry = ModelEntry(
        f"evil{ESC}[2J", Path("/m.gguf"), 10**9, f"Q4{ESC}]0;x\x07", 1 << 30, "huggingface", "ab"
    )
    assert ESC not in entry.label() and "evil\\x1b[2J" in entry.label()
    health = Health.from_dict(
        {
            "status": "ready",
            "model": f"m{ESC}[1m",
            "target": "m.gguf",
            "draft_error": f"bad{ESC}[2J",
            "methods": [],
        }
    )
    text = served_text(health, None, current=None)
    assert ESC not in text and "bad\\x1b[2J" in text
    assert text.count("\n") >= 3  # lines stay lines
