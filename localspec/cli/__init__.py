"""The `localspec` command. Each command lives in its own module and registers on `cli`."""

from __future__ import annotations

# Importing a command module registers its commands on `cli`.
from localspec.cli import bench as _bench  # noqa: F401
from localspec.cli import calibrate as _calibrate  # noqa: F401
from localspec.cli import chat as _chat  # noqa: F401
from localspec.cli import generate as _generate  # noqa: F401
from localspec.cli import models as _models  # noqa: F401
from localspec.cli import pickdraft as _pickdraft  # noqa: F401
from localspec.cli import rpcworker as _rpcworker  # noqa: F401
from localspec.cli import serve as _serve  # noqa: F401
from localspec.cli import service as _service  # noqa: F401
from localspec.cli.app import cli
from localspec.process.hugepages import restart_with_huge_pages


def main() -> None:
    """Console-script entry point."""
    restart_with_huge_pages()  # before any model is loaded (see process.hugepages)
    cli(prog_name="localspec")


__all__ = ["cli", "main"]
