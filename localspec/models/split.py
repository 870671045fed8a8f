"""Split GGUF models: one model in N files, `PREFIX-00001-of-0000N.gguf` to `PREFIX-0000N-of-0000N.gguf`.

Hugging Face repositories split large models this way (llama.cpp's `gguf-split`, or gguf-py's
writer); llama.cpp opens part 1 and finds the others beside it by this very name
(`llama_split_path`: five digits each), so every part must be present, named so, in one folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from localspec.errors import ModelFileError

_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_part(name: str) -> tuple[int, int] | None:
    """(this part's number from 1, how many parts) where `name` is named as a part; else None."""
    match = _PART.search(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def is_first_part(name: str) -> bool:
    """False for parts 2..n of a split model, which are opened through part 1."""
    part = split_part(name)
    return part is None or part[0] == 1


def part_names(name: str, count: int | None = None) -> list[str]:
    """Every part's name of the split model `name` is a part of (`count` parts where given, as its
    header says; else as its name says); [name] where `name` is not named as a part."""
    match = _PART.search(name)
    if match is None:
        return [name]
    n = int(match.group(2)) if count is None else count
    head, suffix = name[: match.start()], name[match.end() - len(".gguf") :]
    return [f"{head}-{i:05d}-of-{n:05d}{suffix}" for i in range(1, n + 1)]


def sibling_parts(path: Path, count: int | None = None) -> list[Path]:
    """`part_names` as paths in `path`'s folder."""
    return [path.with_name(name) for name in part_names(path.name, count)]


def every_part(first: Path, count: int, *, param: str | None = None) -> list[Path]:
    """The `count` parts of the split model whose part 1 is `first` (as named, not resolved), in
    order; ModelFileError where `first` is not named as llama.cpp looks for the others, or a part
    is not beside it."""
    if split_part(first.name) != (1, count):
        raise ModelFileError(
            f"{first}: is part 1 of {count} of a split model but not named as one "
            f"(NAME-00001-of-{count:05d}.gguf), as llama.cpp finds the other parts; rename them back",
            param=param,
        )
    parts = sibling_parts(first, count)
    for part in parts[1:]:
        if not part.is_file():
            raise ModelFileError(
                f"{first}: is part 1 of {count} of a split model and {part.name} is not beside it; "
                "fetch every part (localspec pull does)",
                param=param,
            )
    return parts
