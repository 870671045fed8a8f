"""The click group every command hangs from, and the edge where errors become exit codes."""

from __future__ import annotations

import sys
from typing import Any

import click

from localspec import __version__
from localspec.errors import STORAGE_ERRNOS, LocalspecError, storage_error
from localspec.printable import printable

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class UserError(click.ClickException):
    """A LocalspecError shown as one line, exit code 2."""

    exit_code = EXIT_USER_ERROR

    def show(self, file: Any = None) -> None:
        # Messages quote file names and header fields: escaped, so no file can drive the terminal.
        click.echo(f"error: {printable(self.format_message())}", err=True)


class LocalspecGroup(click.Group):
    """Turns library errors into one-line messages at the edge (types, not message text)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LocalspecError as exc:
            raise UserError(exc.message) from None
        except OSError as exc:
            if exc.errno not in STORAGE_ERRNOS:
                raise
            # A read-only or full state folder: one line naming it, not a traceback.
            raise UserError(storage_error(exc).message) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=LocalspecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localspec")
def cli() -> None:
    """localspec: lossless speculative decoding on llama.cpp, as a CLI, a daemon and a chat TUI."""
