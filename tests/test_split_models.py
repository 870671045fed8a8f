"""Models split in parts (NAME-00001-of-0000N.gguf ...): read, listed, loaded and pulled whole."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import tinymodels
from click.testing import CliRunner
from test_hub import REPO, FakeHub, _closed_port, hub  # noqa: F401 (a fixture)

from localspec.cli import cli
from localspec.errors import DownloadError, ModelFileError
from localspec.models.discovery import discover
from localspec.models.gguf_info import read_gguf_info, read_tokens
from localspec.models.hub import pull
from localspec.models.layerskip import derive_layerskip_draft
from localspec.models.split import is_first_part, part_names, split_part

# The tiny model's 30 tensors, at most 12 a part: three parts.
PER_PART = 12


@pytest.fixture
def split_dir(tmp_path: Path, localspec_home: Path) -> Path:
    folder = tmp_path / "split"
    folder.mkdir()
    tinymodels.write_tiny_model(folder / "tiny.gguf", split_max_tensors=PER_PART)
    return folder


def _parts(folder: Path) -> list[Path]:
    return sorted(folder.glob("tiny-*-of-*.gguf"))


def test_part_names() -> None:
    assert split_part("Qwen2.5-7B-Q4_K_M-00002-of-00003.gguf") == (2, 3)
    assert split_part("model.gguf") is None
    assert part_names("dir/m-Q4_K_M-00002-of-00003.GGUF") == [
        "dir/m-Q4_K_M-00001-of-00003.GGUF",
        "dir/m-Q4_K_M-00002-of-00003.GGUF",
        "dir/m-Q4_K_M-00003-of-00003.GGUF",
    ]
    assert part_names("m-00001-of-00002.gguf", count=3)[-1] == "m-00003-of-00003.gguf"
    assert part_names("model.gguf") == ["model.gguf"]
    assert is_first_part("m-00001-of-00002.gguf") and not is_first_part("m-00002-of-00002.gguf")


def test_a_split_model_reads_as_its_whole(split_dir: Path, tmp_path: Path) -> None:
    parts = _parts(split_dir)
    assert [p.name for p in parts] == part_names("tiny-00001-of-00003.gguf")
    split = read_gguf_info(parts[0])
    whole = read_gguf_info(tinymodels.write_tiny_model(tmp_path / "whole.gguf"))
    # Counted over every part, not part 1's tensors alone: the memory planner sizes the model by these.
    assert (split.n_params, split.layer_bytes, split.non_layer_bytes) == (
        whole.n_params,
        whole.layer_bytes,
        whole.non_layer_bytes,
    )
    assert (split.token_embd_bytes, split.output_bytes) == (whole.token_embd_bytes, whole.output_bytes)
    assert split.size_bytes == sum(p.stat().st_size for p in parts)
    assert split.tokenizer_fingerprint == whole.tokenizer_fingerprint


def test_a_missing_part_is_one_line_and_noticed_after_a_cached_read(split_dir: Path) -> None:
    first, _, last = _parts(split_dir)
    read_gguf_info(first)  # cached now
    last.unlink()
    with pytest.raises(
        ModelFileError, match=r"part 1 of 3 of a split model and tiny-00003-of-00003.gguf is not"
    ):
        read_gguf_info(first)


def test_a_later_part_or_a_renamed_first_part_says_what_to_do(split_dir: Path) -> None:
    first, second, _ = _parts(split_dir)
    with pytest.raises(ModelFileError, match="is part 2 of 3 of a split model; open its first part"):
        read_gguf_info(second)
    renamed = first.rename(split_dir / "tiny.gguf")
    with pytest.raises(ModelFileError, match=r"not named as one \(NAME-00001-of-00003\.gguf\)"):
        read_gguf_info(renamed)
    # A part from another model where this one's belongs.
    os.replace(renamed, first)
    shutil.copyfile(first, second)
    with pytest.raises(ModelFileError, match=r"is not part 2 of 3 of tiny-00001-of-00003\.gguf's model"):
        read_gguf_info(first)


def test_discovery_lists_a_split_model_once_at_its_whole_size(split_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "LOCALSPEC_HOME": os.environ["LOCALSPEC_HOME"],
        "LOCALSPEC_MODELS": str(split_dir),
    }
    found = discover(env=env)
    assert [m.display_name for m in found.models] == ["tiny-00001-of-00003.gguf"]
    assert found.models[0].info.size_bytes == sum(p.stat().st_size for p in _parts(split_dir))


def test_a_split_model_generates(split_dir: Path) -> None:
    first = _parts(split_dir)[0]
    args = [
        "generate",
        "--target",
        str(first),
        "--method",
        "none",
        "--max-tokens",
        "4",
        "--raw",
        "the model is",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "4 tokens" in result.stderr


def test_pull_fetches_every_part(
    hub: FakeHub,  # noqa: F811
    split_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub.repos[REPO] = {p.name.replace("tiny-", "tiny-Q4_K_M-"): p.read_bytes() for p in _parts(split_dir)}
    names = sorted(hub.repos[REPO])
    dest = tmp_path / "pulled"
    # Chosen (part 1 is the Q4_K_M file), or named by any of its parts: the model whole, part 1 returned.
    assert pull(REPO, None, dest, progress=False) == dest / names[0]
    assert sorted(p.name for p in dest.glob("*.gguf")) == names
    again = tmp_path / "again"
    assert pull(REPO, names[2], again, progress=False) == again / names[0]
    assert read_gguf_info(again / names[0]).size_bytes == sum(len(data) for data in hub.repos[REPO].values())
    # Offline, a model every part of which is here is used as it is; one with a part missing is not.
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert pull(REPO, names[0], dest, progress=False) == dest / names[0]
    (dest / names[1]).unlink()
    with pytest.raises(DownloadError, match="is unreachable"):
        pull(REPO, names[0], dest, progress=False)


def _in_hub_cache(split_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The hub's cache: each part's name in a snapshot folder links to a blob named by its hash.
    (the blobs folder, part 1 as named in the snapshot)"""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for i, part in enumerate(_parts(split_dir)):
        blob = part.rename(blobs / f"{i:040x}")
        (snapshot / part.name).symlink_to(os.path.relpath(blob, snapshot))
    return blobs, snapshot / "tiny-00001-of-00003.gguf"


def test_a_split_model_in_a_hugging_face_cache_reads_whole(split_dir: Path, tmp_path: Path) -> None:
    blobs, first = _in_hub_cache(split_dir, tmp_path)
    info = read_gguf_info(first)
    assert info.size_bytes == sum(b.stat().st_size for b in blobs.iterdir())
    # As named, not resolved to part 1's blob, beside which llama.cpp would find no other part.
    assert info.path == first
    assert len(read_tokens(info)) == len(tinymodels.build_vocab())
    result = CliRunner().invoke(
        cli, ["generate", "--target", str(first), "--method", "none", "--max-tokens", "2", "--raw", "the"]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.slow  # calibrates the tiny model and its layer-skip draft
def test_pick_draft_measures_a_split_model_in_a_hugging_face_cache(split_dir: Path, tmp_path: Path) -> None:
    # --measure loads the target by the path its info names: the blob's would find no other part.
    _, first = _in_hub_cache(split_dir, tmp_path)
    args = ["pick-draft", "--target", str(first), "--measure", "--vram", "0", "--ram", "8G", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"] == str(first)
    assert any(c["method"] == "layerskip" and "measured" in c["reason"] for c in data["candidates"])


def test_a_layer_skip_draft_of_a_split_target_is_one_whole_file(split_dir: Path, tmp_path: Path) -> None:
    first = _parts(split_dir)[0]
    whole = tinymodels.write_tiny_model(tmp_path / "whole.gguf")
    cache = tmp_path / "derived"
    from_split = read_gguf_info(derive_layerskip_draft(first, [0, 2], cache_dir=cache))
    from_whole = read_gguf_info(derive_layerskip_draft(whole, [0, 2], cache_dir=cache))
    # Every kept tensor, from whichever part held it; one file (no split.* keys copied over).
    assert (from_split.n_params, from_split.layer_bytes) == (from_whole.n_params, from_whole.layer_bytes)
    assert from_split.n_layers == 2 and split_part(from_split.path.name) is None
    args = ["generate", "--target", str(first), "--method", "layerskip", "--max-tokens", "4", "--raw", "the"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "method layerskip" in result.stderr, result.stderr
