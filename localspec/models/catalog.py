"""The catalog of known models and target -> draft pairs (`models/catalog.toml`)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import ConfigError


@dataclass(frozen=True)
class PypiSource:
    """A GGUF carried in parts by PyPI packages."""

    package: str
    version: str
    parts: int
    member: str

    def part(self, n: int) -> tuple[str, str]:
        """The requirement and the member path of part `n` (1-based)."""
        req = f"{self.package.format(n=n)}=={self.version}"
        return req, self.member.format(n=n)


@dataclass(frozen=True)
class CatalogModel:
    name: str
    file: str
    hf_repo: str
    hf_file: str
    size_bytes: int
    sha256: str
    pypi: PypiSource | None


@dataclass(frozen=True)
class Catalog:
    models: dict[str, CatalogModel]
    pairs: list[tuple[str, str]]
    default_target: str
    default_draft: str

    def get(self, name: str) -> CatalogModel:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise ConfigError(f"unknown catalog model {name!r}; known: {known}") from None


def catalog_path() -> Path:
    here = Path(__file__).resolve().parent
    packaged = here / "catalog.toml"  # a wheel carries it beside this module (pyproject's force-include)
    return packaged if packaged.is_file() else here.parents[1] / "models" / "catalog.toml"


def load_catalog(path: Path | None = None) -> Catalog:
    """Read the catalog; the packaged copy when installed, `models/catalog.toml` in a checkout."""
    data = tomllib.loads((path or catalog_path()).read_text(encoding="utf-8"))
    models = {name: _model(name, raw) for name, raw in data.get("models", {}).items()}
    pairs = [(p["target"], p["draft"]) for p in data.get("pairs", [])]
    return Catalog(models, pairs, data["default_target"], data["default_draft"])


def _model(name: str, raw: dict[str, object]) -> CatalogModel:
    pypi_raw = raw.get("pypi")
    pypi = None
    if isinstance(pypi_raw, dict):
        pypi = PypiSource(
            package=str(pypi_raw["package"]),
            version=str(pypi_raw["version"]),
            parts=int(pypi_raw["parts"]),
            member=str(pypi_raw["member"]),
        )
    size = raw["size_bytes"]
    assert isinstance(size, int)
    return CatalogModel(
        name=name,
        file=str(raw["file"]),
        hf_repo=str(raw["hf_repo"]),
        hf_file=str(raw["hf_file"]),
        size_bytes=size,
        sha256=str(raw["sha256"]),
        pypi=pypi,
    )
