"""`localspec models` and `localspec inspect` through click's runner, on real and tiny GGUF files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tinymodels
from click.testing import CliRunner, Result
from test_gguf_info import shared_cache

from localspec.cli import cli
from localspec.models.gguf_info import read_gguf_info


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.mark.slow
def test_models_json_on_the_real_models(
    isolated: Path,
    localspec_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
    qwen_target: Path,
    qwen_draft: Path,
    gemma: Path,
    smollm: Path,
) -> None:
    for path in (qwen_target, qwen_draft, gemma, smollm):
        (isolated / path.name).symlink_to(path)
        read_gguf_info(path, cache_dir=shared_cache(tmp_path_factory))
    # Start from the session's warm cache (a cold parse of the four takes about a second).
    shutil.copytree(shared_cache(tmp_path_factory), localspec_home / "cache")

    result = run("models", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["display_name"]: row for row in json.loads(result.stdout)}
    expected = {
        qwen_target.name: ("qwen2", "Q4_K_M", 1_117_320_768),
        qwen_draft.name: ("qwen2", "Q4_K_M", 491_400_064),
        gemma.name: ("gemma3", "Q4_K_M", 253_113_024),
        smollm.name: ("llama", "Q4_1", 98_362_432),
    }
    assert {name: (r["arch"], r["quant"], r["size_bytes"]) for name, r in rows.items()} == expected
    for row in rows.values():
        assert row["source"] == "models"
        assert Path(row["path"]).is_file()
        assert row["n_params"] > 0 and row["n_ctx_train"] > 0 and len(row["tokenizer_fingerprint"]) == 16
        assert "chat_template" not in row
    assert rows[qwen_target.name]["tokenizer_fingerprint"] == rows[qwen_draft.name]["tokenizer_fingerprint"]


def test_models_table(isolated: Path, tiny_target: Path, tiny_other_vocab: Path, tmp_path: Path) -> None:
    shutil.copyfile(tiny_target, isolated / "target.gguf")
    extra = tmp_path / "extra"
    extra.mkdir()
    shutil.copyfile(tiny_other_vocab, extra / "other.gguf")
    (isolated / "broken.gguf").write_bytes(b"GGUF\x03\x00")

    result = run("models", "--search-path", str(extra))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "TOKENIZER", "SOURCE"]
    fingerprint = read_gguf_info(tiny_target).tokenizer_fingerprint[:8]
    assert [line.split()[0] for line in lines[1:]] == ["other.gguf", "target.gguf"]
    target = lines[2].split()
    assert target[1] == "llama" and target[3] == "F32" and target[-2:] == [fingerprint, "models"]
    assert lines[1].split()[-1] == "search-path"
    assert result.stderr.startswith(f"skipped {isolated / 'broken.gguf'}: ")
    assert "truncated" in result.stderr


def test_models_when_there_are_none(isolated: Path) -> None:
    result = run("models")
    assert (result.exit_code, result.stdout) == (0, "")
    assert "no models found" in result.stderr
    assert json.loads(run("models", "--json").stdout) == []


def test_inspect_human(tiny_target: Path) -> None:
    result = run("inspect", str(tiny_target))
    assert result.exit_code == 0, result.output
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines())
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["name"] == "tiny-target"
    assert fields["architecture"] == "llama"
    assert fields["quantization"] == "F32"
    assert fields["tokenizer"] == "llama (spm), pre -"
    assert fields["BOS"] == "1 (added to prompts)"
    assert fields["fingerprint"] == read_gguf_info(tiny_target).tokenizer_fingerprint
    assert fields["chat template"].startswith("yes")


def test_inspect_json_has_every_field(tiny_target: Path) -> None:
    result = run("inspect", "--json", str(tiny_target))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(json.dumps(read_gguf_info(tiny_target).to_dict()))
    assert data["chat_template"] == tinymodels.CHATML_TEMPLATE


def bad_inputs(tmp: Path, tiny_target: Path) -> dict[str, tuple[Path, str]]:
    text = tmp / "notes.gguf"
    text.write_text("just some text\n")
    cut = tmp / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:20_000])
    return {
        "missing": (tmp / "absent.gguf", "no such file"),
        "directory": (tmp, "is a directory"),
        "not gguf": (text, "not a GGUF file"),
        "truncated": (cut, "truncated or corrupt GGUF"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "not gguf", "truncated"])
@pytest.mark.parametrize("as_json", [False, True])
def test_inspect_bad_inputs_are_one_line(tmp_path: Path, tiny_target: Path, case: str, as_json: bool) -> None:
    path, message = bad_inputs(tmp_path, tiny_target)[case]
    result = run("inspect", *(["--json"] if as_json else []), str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {path}: {message}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_commands_have_help() -> None:
    for command in ("models", "inspect", "pull"):
        result = run(command, "--help")
        assert result.exit_code == 0 and "Usage:" in result.stdout


def test_rm_deletes_a_model_from_the_models_folder_only(isolated: Path, tiny_target: Path) -> None:
    """No daemon runs here: `rm` deletes the file itself, by the rule /api/delete keeps."""
    shutil.copyfile(tiny_target, isolated / "scratch.gguf")
    hub = Path.home() / ".cache" / "huggingface" / "hub" / "models--acme--Tiny-GGUF" / "snapshots" / "abc"
    hub.mkdir(parents=True)
    shutil.copyfile(tiny_target, hub / "tiny.gguf")

    deleted = run("rm", "scratch")
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout.startswith("deleted scratch (") and not (isolated / "scratch.gguf").exists()
    gone = run("rm", "scratch")
    assert gone.exit_code == 2 and "no model named 'scratch' here; `localspec models`" in gone.stderr
    kept = run("rm", "acme/Tiny-GGUF:tiny.gguf")
    assert kept.exit_code == 2 and "`hf cache rm`" in kept.stderr and (hub / "tiny.gguf").exists()
