"""Writing a small file so that no reader, and no crash, ever sees half of it."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Write `text` (UTF-8) beside `path` under a temporary name, then rename it over `path`.

    The temporary name carries this process's id, so two processes writing the same file never
    write into one half-finished copy; whichever renames last wins, whole. `mode` is applied at
    creation (the umask still narrows it). The default, 0o600, keeps a private file private from the
    first byte: localspec's state files name model paths and chats hold prompts.
    On any failure the temporary file is removed and the error raised.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
