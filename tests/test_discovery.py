"""discover() on real folder layouts (models folder, HF cache, LM Studio, Ollama) holding tiny GGUFs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import tinymodels

from localspec.models.discovery import Discovery, discover, find_candidates

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def env(tmp_path: Path, localspec_home: Path) -> dict[str, str]:
    """An environment with a private HOME and models folder, so no real user folder is scanned."""
    home = tmp_path / "home"
    home.mkdir()
    models = tmp_path / "models"
    models.mkdir()
    return {"HOME": str(home), "LOCALSPEC_HOME": str(localspec_home), "LOCALSPEC_MODELS": str(models)}


def names(found: Discovery) -> list[tuple[str, str]]:
    return [(m.source, m.display_name) for m in found.models]


def put(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def hf_snapshot(cache: Path, repo: str, filename: str, src: Path, rev: str = REV) -> Path:
    """The hub cache layout: the blob under blobs/, a relative symlink to it under snapshots/<rev>/."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    blob = put(src, repo_dir / "blobs" / digest)
    link = repo_dir / "snapshots" / rev / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(rev)
    return link


def ollama_model(root: Path, name: str, src: Path, registry: str = "registry.ollama.ai") -> Path:
    """Ollama's layout: a manifest naming layers by digest, the model layer stored as blobs/sha256-<hex>."""
    model, tag = name.split(":")
    ns, _, model = model.rpartition("/")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    blob = put(src, root / "blobs" / f"sha256-{digest}")
    manifest = root / "manifests" / registry / (ns or "library") / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {
            "mediaType": "application/vnd.ollama.image.model",
            "digest": f"sha256:{digest}",
            "size": blob.stat().st_size,
        },
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
    ]
    config = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "1" * 64}
    manifest.write_text(json.dumps({"schemaVersion": 2, "config": config, "layers": layers}))
    return blob


def test_nothing_anywhere(env: dict[str, str]) -> None:
    found = discover(env=env)
    assert found.models == [] and found.skipped == []


def test_models_folder(env: dict[str, str], tiny_target: Path, tiny_other_vocab: Path) -> None:
    models = Path(env["LOCALSPEC_MODELS"])
    put(tiny_target, models / "target.gguf")
    put(tiny_other_vocab, models / "sub" / "other.gguf")
    put(tiny_target, models / ".cache" / "hidden.gguf")
    put(tiny_target, models / "big-00002-of-00003.gguf")  # not the first part of a split model
    (models / "notes.txt").write_text("not a model")
    found = discover(env=env)
    assert names(found) == [("models", "sub/other.gguf"), ("models", "target.gguf")]
    assert found.models[1].info.name == "tiny-target"
    assert found.skipped == []


def test_huggingface_cache(
    env: dict[str, str], tiny_target: Path, tiny_other_vocab: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    env["HF_HUB_CACHE"] = str(cache)
    hf_snapshot(cache, "acme/Tiny-GGUF", "tiny-Q4_K_M.gguf", tiny_target)
    # A second revision pointing at the same blob counts once.
    hf_snapshot(cache, "acme/Tiny-GGUF", "tiny-Q4_K_M.gguf", tiny_target, rev="f" * 40)
    hf_snapshot(cache, "acme/Tiny-GGUF", "sub/other.gguf", tiny_other_vocab)
    found = discover(env=env)
    assert names(found) == [
        ("huggingface", "acme/Tiny-GGUF:sub/other.gguf"),
        ("huggingface", "acme/Tiny-GGUF:tiny-Q4_K_M.gguf"),
    ]
    assert found.models[1].path.name == "tiny-Q4_K_M.gguf"
    # Described by the name it was found by, not the blob it links to (a hash, no model's name).
    assert found.models[1].info.path == found.models[1].path


@pytest.mark.parametrize("var", ["HF_HOME", "XDG_CACHE_HOME", None])
def test_huggingface_cache_location(
    env: dict[str, str], tiny_target: Path, tmp_path: Path, var: str | None
) -> None:
    if var == "HF_HOME":
        env[var] = str(tmp_path / "hf")
        cache = tmp_path / "hf" / "hub"
    elif var == "XDG_CACHE_HOME":
        env[var] = str(tmp_path / "xdg")
        cache = tmp_path / "xdg" / "huggingface" / "hub"
    else:
        cache = Path(env["HOME"]) / ".cache" / "huggingface" / "hub"
    hf_snapshot(cache, "acme/tiny", "model.gguf", tiny_target)
    assert names(discover(env=env)) == [("huggingface", "acme/tiny:model.gguf")]


def test_lmstudio_folders(env: dict[str, str], tiny_target: Path, tiny_other_vocab: Path) -> None:
    home = Path(env["HOME"])
    put(tiny_target, home / ".lmstudio" / "models" / "acme" / "Tiny-GGUF" / "tiny-Q4_K_M.gguf")
    put(tiny_other_vocab, home / ".cache" / "lm-studio" / "models" / "old" / "Other-GGUF" / "other.gguf")
    assert names(discover(env=env)) == [
        ("lmstudio", "acme/Tiny-GGUF/tiny-Q4_K_M.gguf"),
        ("lmstudio", "old/Other-GGUF/other.gguf"),
    ]


def test_ollama_store(env: dict[str, str], tiny_target: Path, tiny_other_vocab: Path, tmp_path: Path) -> None:
    root = Path(env["HOME"]) / ".ollama" / "models"
    blob = ollama_model(root, "tiny:latest", tiny_target)
    ollama_model(root, "someone/other:q4", tiny_other_vocab)
    mirrored = tinymodels.write_tiny_model(tmp_path / "mirrored.gguf", seed=5)
    ollama_model(root, "ns/mirror:v1", mirrored, registry="example.com")
    ollama_model(root, "tiny:copy", tiny_target)  # the same blob under a second name counts once
    (root / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "broken").write_text("{not json")
    found = discover(env=env)
    assert names(found) == [
        ("ollama", "example.com/ns/mirror:v1"),
        ("ollama", "someone/other:q4"),
        ("ollama", "tiny:copy"),
    ]
    assert found.models[2].path == blob
    assert found.models[2].info.arch == "llama"


def test_ollama_models_variable_and_a_missing_blob(
    env: dict[str, str], tiny_target: Path, tmp_path: Path
) -> None:
    root = tmp_path / "elsewhere"
    env["OLLAMA_MODELS"] = str(root)
    blob = ollama_model(root, "tiny:latest", tiny_target)
    blob.unlink()
    found = discover(env=env)
    assert found.models == []
    assert [(s.display_name, s.reason) for s in found.skipped] == [("tiny:latest", f"{blob}: no such file")]


def test_search_paths_folder_and_file(env: dict[str, str], tiny_target: Path, tmp_path: Path) -> None:
    folder = tmp_path / "extra"
    put(tiny_target, folder / "deep" / "a.gguf")
    single = put(tiny_target, tmp_path / "single.gguf")
    found = discover([folder, single], env=env)
    assert names(found) == [("search-path", "deep/a.gguf"), ("search-path", "single.gguf")]


def test_duplicates_count_once_and_the_first_source_wins(env: dict[str, str], tiny_target: Path) -> None:
    models = Path(env["LOCALSPEC_MODELS"])
    real = put(tiny_target, models / "target.gguf")
    lmstudio = Path(env["HOME"]) / ".lmstudio" / "models" / "acme" / "x"
    lmstudio.mkdir(parents=True)
    (lmstudio / "link.gguf").symlink_to(real)
    found = discover([models, real], env=env)
    assert names(found) == [("models", "target.gguf")]


def test_unreadable_files_are_skipped_with_a_reason(env: dict[str, str], tiny_target: Path) -> None:
    models = Path(env["LOCALSPEC_MODELS"])
    put(tiny_target, models / "good.gguf")
    (models / "empty.gguf").write_bytes(b"")
    (models / "cut.gguf").write_bytes(tiny_target.read_bytes()[:5000])
    found = discover(env=env)
    assert names(found) == [("models", "good.gguf")]
    reasons = {s.path.name: s.reason for s in found.skipped}
    assert "not a GGUF file" in reasons["empty.gguf"]
    assert "truncated" in reasons["cut.gguf"]


def test_symlink_loops_do_not_hang(env: dict[str, str], tiny_target: Path) -> None:
    models = Path(env["LOCALSPEC_MODELS"])
    put(tiny_target, models / "a" / "m.gguf")
    (models / "a" / "loop").symlink_to(models)
    assert [c.display_name for c in find_candidates(env=env)] == ["a/m.gguf"]
