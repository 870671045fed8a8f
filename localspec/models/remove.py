"""Removing a model: only files in the models folder, which `localspec pull` and /api/pull write.

Ollama's store, the Hugging Face cache and LM Studio's folders belong to those programs, which
keep indexes beside the files: deleting a file under them would leave their indexes wrong. A
model file reached through a link is refused too: the link's target is not the models folder's
to delete. Used by `localspec rm` and by Ollama's DELETE /api/delete.
"""

from __future__ import annotations

from pathlib import Path

from localspec.errors import UserInputError
from localspec.models.split import sibling_parts, split_part

# Where other programs keep the models discovery also finds, and how they are removed there.
OWNERS = {
    "ollama": "is in Ollama's store: remove it with `ollama rm`",
    "huggingface": "is in the Hugging Face cache: remove it with `hf cache rm`",
    "lmstudio": "is in LM Studio's folder: remove it in LM Studio",
    "search-path": "is in a folder given with --search-path: delete the file yourself",
}


def removable_files(name: str, path: Path, source: str, models_dir: Path, *, where: str = "") -> list[Path]:
    """The files removing model `name` (its file `path`, found in `source`) deletes: the file and
    any split parts, each a file of its own inside `models_dir`. UserInputError (one line naming
    what removes it instead) for any other; `where` words a source OWNERS does not know."""
    if source != "models":
        said = OWNERS.get(source, where or f"is not in the models folder ({models_dir})")
        raise UserInputError(
            f"{name} {said} (localspec deletes only files in its models folder)", param="model"
        )
    split = split_part(path.name)
    paths = sibling_parts(path, split[1]) if split else [path]
    root = models_dir.resolve()
    for part in paths:
        inside = root / part.relative_to(models_dir) if part.is_relative_to(models_dir) else None
        if part.is_symlink() or part.resolve() != inside:
            raise UserInputError(
                f"{name}: {part} is a link to {part.resolve()}; localspec deletes only files it holds "
                "in its models folder: remove the link yourself",
                param="model",
            )
    return paths


def remove_files(name: str, paths: list[Path]) -> None:
    """Delete `paths` (from `removable_files`); one line where the system refuses."""
    try:
        for path in paths:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise UserInputError(f"cannot delete {name}: {exc.strerror or exc}", param="model") from None
