"""Hostile GGUF headers: every one is refused as a corrupt file, with its offset, never a crash."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import hostilegguf
import pytest
import tinymodels

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.errors import ModelFileError
from localspec.models.gguf_header import read_header
from localspec.models.gguf_info import read_gguf_info
from localspec.types import GenerationRequest, SpecParams


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return hostilegguf.write_corpus(tmp_path_factory.mktemp("hostile"))


def test_the_base_file_reads_as_a_model(corpus: dict[str, Path], tmp_path: Path) -> None:
    info = read_gguf_info(corpus[hostilegguf.BASE], cache_dir=tmp_path)
    assert (info.arch, info.n_layers, info.n_ctx_train, info.vocab_size) == ("llama", 1, 128, 6)


@pytest.mark.parametrize("name", sorted(hostilegguf.HOSTILE))
def test_hostile_file_is_a_corrupt_file_error(corpus: dict[str, Path], tmp_path: Path, name: str) -> None:
    with pytest.raises(ModelFileError) as err:
        read_gguf_info(corpus[name], cache_dir=tmp_path)
    message = err.value.message
    assert "corrupt GGUF" in message and "at byte" in message
    assert "\n" not in message and "\x1b" not in message


def test_the_offset_points_at_the_bad_value(corpus: dict[str, Path]) -> None:
    data = corpus["ctx-inf"].read_bytes()
    value_at = data.index(struct.pack("<f", float("inf")))
    with pytest.raises(ModelFileError, match=f"at byte {value_at}: llama.context_length is inf"):
        read_gguf_info(corpus["ctx-inf"])


def test_nested_arrays_a_few_deep_are_still_read(tmp_path: Path) -> None:
    path = tmp_path / "nested.gguf"
    path.write_bytes(hostilegguf.base(extra=[hostilegguf._nested(2)]).to_bytes())
    assert read_header(path).metadata["hostile.nested"] == [[[]]]


def test_mutated_files_are_read_or_refused_never_crash(tmp_path: Path) -> None:
    """300 seeded mutations of a real tiny model: flipped bytes, truncations, overwritten lengths."""
    original = tinymodels.write_tiny_model(tmp_path / "tiny.gguf").read_bytes()
    header_end = read_header(tmp_path / "tiny.gguf").data_offset
    rng = random.Random(17)
    outcomes = {"read": 0, "refused": 0}
    for i in range(300):
        data = bytearray(original)
        at = rng.randrange(4, header_end)
        kind = i % 3
        if kind == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[at : at + 8] = struct.pack("<Q", rng.choice([1 << 63, 1 << 40, 2**64 - 1, 0x7FFFFFFF]))
        else:
            del data[at:]
        path = tmp_path / f"m{i}.gguf"
        path.write_bytes(bytes(data))
        try:
            read_gguf_info(path, cache_dir=tmp_path / "cache")
        except ModelFileError:
            outcomes["refused"] += 1
        except Exception as exc:  # an UnsupportedModelError is fine: a valid header for an odd model
            assert type(exc).__name__ == "UnsupportedModelError", f"mutation {i}: {exc!r}"
            outcomes["refused"] += 1
        else:
            outcomes["read"] += 1
        path.unlink()
    assert outcomes["refused"] > 100  # the mutations do reach the checks


# What each caller does with a hostile file: skip it, refuse it in one line, or serve without it.


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from localspec.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_models_skips_hostile_files_and_lists_the_rest(
    corpus: dict[str, Path], isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One hostile file where a download would put it: the Hugging Face cache.
    home = Path(os.environ["HOME"])
    snapshot = home / ".cache/huggingface/hub/models--evil--repo/snapshots/abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(corpus["nested-arrays"], snapshot / "evil.gguf")
    done = _cli("models", "--json", "--search-path", str(corpus["base"].parent), env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    listed = [row["display_name"] for row in json.loads(done.stdout)]
    assert listed == ["base.gguf"]
    skipped = [line for line in done.stderr.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == len(hostilegguf.HOSTILE) + 1
    assert any("evil.gguf" in line and "corrupt GGUF" in line for line in skipped)
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["nested-arrays", "ctx-inf", "block-index-huge"])
def test_inspect_refuses_in_one_line(corpus: dict[str, Path], name: str) -> None:
    done = _cli("inspect", str(corpus[name]))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "corrupt GGUF" in done.stderr


def test_serve_refuses_a_hostile_target_in_one_line(corpus: dict[str, Path], tmp_path: Path) -> None:
    done = _cli("serve", "--target", str(corpus["ctx-inf"]), "--socket", str(tmp_path / "d.sock"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "corrupt GGUF" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "d.sock").exists()


def test_generate_refuses_a_hostile_target_in_one_line(corpus: dict[str, Path]) -> None:
    done = _cli("generate", "--target", str(corpus["tokens-count-huge"]), "--method", "none", "hello")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "corrupt GGUF" in done.stderr


@pytest.mark.parametrize("name", ["nested-arrays", "blocks-nan", "block-index-huge"])
def test_a_hostile_draft_leaves_the_target_serving(
    corpus: dict[str, Path], tiny_target: Path, name: str
) -> None:
    config = EngineConfig(target=tiny_target, draft=corpus[name], load=LoadOptions(n_ctx=256, n_threads=1))
    with Engine(config) as engine:
        info = engine.wait_ready()
        assert info.status == "ready"
        assert info.draft_error is not None and "corrupt GGUF" in info.draft_error
        request = GenerationRequest(prompt="hello world", max_tokens=4, speculative=SpecParams("draft", 4))
        result = engine.generate(request)
        assert len(result.token_ids) == 4
        assert result.stats.fallback_reason is not None and "corrupt GGUF" in result.stats.fallback_reason
