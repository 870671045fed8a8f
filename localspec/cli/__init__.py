"""The `localspec` command. Each command lives in its own module and registers on `cli`."""

from __future__ import annotations

import contextlib

with contextlib.suppress(ImportError):  # TEMP until the models commands land
    from localspec.cli import models as _models  # noqa: F401  (registers commands)
from localspec.cli.app import cli


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="localspec")


__all__ = ["cli", "main"]
