"""read_gguf_info on GGUF files written here and on the real models, and its on-disk cache."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import pytest
import tinymodels

from localspec.errors import ModelFileError, UnsupportedModelError
from localspec.models.gguf_info import GGUFInfo, llama_cpp_knows, read_gguf_info, read_tokens


def shared_cache(factory: pytest.TempPathFactory) -> Path:
    """One cache folder for the whole session, shared by every test module that reads the real models.

    The first read of a 150k-token model parses its header (~0.2 s); later reads hit this cache.
    """
    folder = factory.getbasetemp() / "real-model-gguf-cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_cache(tmp_path_factory)


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    name: str | None = None,
    tokens: Sequence[str] = ("<unk>", "<s>", "</s>", "a", "b", "c"),
    ints: dict[str, int] | None = None,
    strings: dict[str, str] | None = None,
) -> Path:
    """A minimal GGUF: a few header values, a token list and two small tensors."""
    writer = gguf.GGUFWriter(path, arch)
    if name is not None:
        writer.add_name(name)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    if tokens:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(list(tokens))
    for key, value in (ints or {}).items():
        writer.add_uint32(key, value)
    for key, text in (strings or {}).items():
        writer.add_string(key, text)
    writer.add_tensor("token_embd.weight", np.zeros((max(len(tokens), 1), 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# The tiny llama models: every field against what was written.


def test_tiny_model_fields(tmp_path: Path) -> None:
    vocab = tinymodels.build_vocab()
    path = tinymodels.write_tiny_model(
        tmp_path / "t.gguf", n_layers=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128
    )
    info = read_gguf_info(path)

    d, kv, ff, n = 64, 64 // 4 * 2, 128, len(vocab)
    per_layer = d + d * d + 2 * kv * d + d * d + d + 3 * ff * d
    assert info.path == path.resolve()
    assert (info.name, info.arch, info.quant) == ("tiny", "llama", "F32")
    assert info.n_params == 2 * n * d + d + 3 * per_layer
    assert info.size_bytes == path.stat().st_size
    assert (info.n_ctx_train, info.n_layers, info.n_embd, info.n_head, info.n_head_kv) == (2048, 3, 64, 4, 2)
    assert (info.head_dim_k, info.head_dim_v) == (16, 16)
    assert info.layer_bytes == (4 * per_layer,) * 3
    assert info.non_layer_bytes == 4 * (2 * n * d + d)
    assert info.token_embd_bytes == info.output_bytes == 4 * n * d
    assert (info.vocab_type, info.llama_vocab_type, info.vocab_size) == ("llama", "spm", n)
    assert (info.bos_id, info.eos_id) == (1, vocab.id(tinymodels.IM_END))
    assert (info.add_bos, info.add_eos) == (True, False)
    assert info.has_chat_template and info.chat_template == tinymodels.CHATML_TEMPLATE
    assert not info.has_fim
    assert len(info.tokenizer_fingerprint) == 16


def test_f16_model_reports_f16(tmp_path: Path) -> None:
    info = read_gguf_info(tinymodels.write_tiny_model(tmp_path / "h.gguf", dtype="f16"))
    assert info.quant == "F16"
    assert (
        info.layer_bytes[0] < read_gguf_info(tinymodels.write_tiny_model(tmp_path / "f.gguf")).layer_bytes[0]
    )


def test_tokens_match_the_file(tiny_target: Path) -> None:
    info = read_gguf_info(tiny_target)
    assert read_tokens(info) == list(tinymodels.build_vocab().tokens)


def test_to_dict_is_json_and_round_trips(tiny_target: Path) -> None:
    info = read_gguf_info(tiny_target)
    data = json.loads(json.dumps(info.to_dict()))
    assert data["path"] == str(tiny_target.resolve())
    assert GGUFInfo.from_dict(data) == info


def test_fingerprint_follows_the_vocabulary_not_the_weights(
    tiny_target: Path, tiny_useless_draft: Path, tiny_other_vocab: Path, tmp_path: Path
) -> None:
    target = read_gguf_info(tiny_target).tokenizer_fingerprint
    assert read_gguf_info(tiny_useless_draft).tokenizer_fingerprint == target
    assert read_gguf_info(tiny_other_vocab).tokenizer_fingerprint != target
    other_eos = tinymodels.write_tiny_model(tmp_path / "e.gguf", eos_id=2)
    assert read_gguf_info(other_eos).tokenizer_fingerprint != target


# Header values that are missing, or given in their less common forms.


def test_name_falls_back_to_the_file_stem(tmp_path: Path) -> None:
    info = read_gguf_info(write_gguf(tmp_path / "nameless-model.gguf"))
    assert info.name == "nameless-model"
    assert info.quant == "F32"  # no general.file_type: the type holding most bytes


def test_llama_cpp_defaults_when_the_tokenizer_is_silent(tmp_path: Path) -> None:
    # gpt2 (BPE) vocabularies default to BOS = EOS = 11 and add neither, as in llama.cpp.
    tokens = [f"t{i}" for i in range(20)]
    info = read_gguf_info(write_gguf(tmp_path / "m.gguf", tokens=tokens))
    assert (info.bos_id, info.eos_id, info.add_bos, info.add_eos) == (11, 11, False, False)
    llama3 = write_gguf(tmp_path / "l3.gguf", tokens=tokens, strings={"tokenizer.ggml.pre": "llama-bpe"})
    assert read_gguf_info(llama3).add_bos


def test_fim_ids_from_header_keys(tmp_path: Path) -> None:
    ids = {"tokenizer.ggml.fim_pre_token_id": 3, "tokenizer.ggml.fim_suf_token_id": 4}
    ids["tokenizer.ggml.fim_mid_token_id"] = 5
    info = read_gguf_info(write_gguf(tmp_path / "m.gguf", ints=ids))
    assert (info.fim_prefix_id, info.fim_suffix_id, info.fim_middle_id) == (3, 4, 5)
    assert info.has_fim


def test_fim_ids_from_token_texts(tmp_path: Path) -> None:
    tokens = ["<unk>", "<s>", "</s>", "x", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
    info = read_gguf_info(write_gguf(tmp_path / "m.gguf", tokens=tokens))
    assert (info.fim_prefix_id, info.fim_suffix_id, info.fim_middle_id) == (4, 6, 5)


# Files that are not usable models: one clear line each.


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        read_gguf_info(tmp_path / "absent.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="is a directory"):
        read_gguf_info(tmp_path)


@pytest.mark.parametrize("content", [b"", b"GG", b"hello, not a model\n", b"PK\x03\x04" + bytes(100)])
def test_not_gguf(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf_info(path)


@pytest.mark.parametrize("keep", [8, 30, 2000, 0.5, -1])
def test_truncated(tiny_target: Path, tmp_path: Path, keep: float) -> None:
    data = tiny_target.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelFileError, match="truncated") as err:
        read_gguf_info(path)
    assert "\n" not in err.value.message


def test_unknown_architecture(tmp_path: Path) -> None:
    assert not llama_cpp_knows("no-such-arch")
    with pytest.raises(UnsupportedModelError, match=r"'no-such-arch' is not one llama\.cpp can run"):
        read_gguf_info(write_gguf(tmp_path / "m.gguf", arch="no-such-arch"))


def test_architecture_that_cannot_generate(tmp_path: Path) -> None:
    assert llama_cpp_knows("clip")
    with pytest.raises(UnsupportedModelError, match="cannot generate text"):
        read_gguf_info(write_gguf(tmp_path / "mmproj.gguf", arch="clip"))


def test_no_vocabulary(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="no tokenizer vocabulary"):
        read_gguf_info(write_gguf(tmp_path / "m.gguf", tokens=()))


def test_lora_adapter(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "lora.gguf", strings={"general.type": "adapter"})
    with pytest.raises(UnsupportedModelError, match="LoRA adapter"):
        read_gguf_info(path)


# The cache.


def test_cached_info_equals_a_fresh_parse(tiny_target: Path, tmp_path: Path) -> None:
    first = read_gguf_info(tiny_target, cache_dir=tmp_path / "c")
    assert list((tmp_path / "c").rglob("*.json"))
    assert read_gguf_info(tiny_target, cache_dir=tmp_path / "c") == first
    assert read_gguf_info(tiny_target, cache_dir=tmp_path / "other") == first


def test_cache_sees_a_changed_file(tmp_path: Path) -> None:
    path = tinymodels.write_tiny_model(tmp_path / "m.gguf", n_layers=2)
    assert read_gguf_info(path).n_layers == 2
    tinymodels.write_tiny_model(path, n_layers=4)
    assert read_gguf_info(path).n_layers == 4


def test_a_broken_cache_is_ignored(tiny_target: Path, localspec_home: Path) -> None:
    info = read_gguf_info(tiny_target)
    for entry in (localspec_home / "cache").rglob("*.json"):
        entry.write_text("{not json")
    assert read_gguf_info(tiny_target) == info
    assert read_tokens(info) == list(tinymodels.build_vocab().tokens)


def test_read_tokens_refuses_a_file_that_changed(tmp_path: Path, localspec_home: Path) -> None:
    path = tinymodels.write_tiny_model(tmp_path / "m.gguf")
    info = read_gguf_info(path)
    shutil.rmtree(localspec_home / "cache")
    tinymodels.write_tiny_model(path, vocab=tinymodels.build_vocab(tinymodels.OTHER_WORDS))
    with pytest.raises(ModelFileError, match="changed since it was read"):
        read_tokens(info)


# The real models.

REAL = {
    # fixture: (arch, quant, n_layers, n_ctx_train, vocab_size, bos, eos, add_bos, has_fim)
    "qwen_target": ("qwen2", "Q4_K_M", 28, 32768, 151936, 151643, 151645, False, True),
    "qwen_draft": ("qwen2", "Q4_K_M", 24, 32768, 151936, 151643, 151645, False, True),
    "gemma": ("gemma3", "Q4_K_M", 18, 32768, 262144, 2, 1, True, False),
    "smollm": ("llama", "Q4_1", 30, 8192, 49152, 1, 2, False, False),
}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", sorted(REAL))
def test_real_models(fixture: str, request: pytest.FixtureRequest, real_cache: Path) -> None:
    path: Path = request.getfixturevalue(fixture)
    info = read_gguf_info(path, cache_dir=real_cache)
    arch, quant, n_layers, n_ctx, n_vocab, bos, eos, add_bos, has_fim = REAL[fixture]
    assert (info.arch, info.quant, info.n_layers, info.n_ctx_train) == (arch, quant, n_layers, n_ctx)
    assert (info.vocab_size, info.bos_id, info.eos_id, info.add_bos) == (n_vocab, bos, eos, add_bos)
    assert info.has_fim == has_fim
    assert info.size_bytes == path.stat().st_size
    assert len(info.layer_bytes) == n_layers and all(info.layer_bytes)
    # Tensor bytes plus the header make up the file.
    assert 0 < info.size_bytes - sum(info.layer_bytes) - info.non_layer_bytes < 16 << 20


@pytest.mark.slow
def test_real_qwen_pair_shares_a_stable_fingerprint(
    qwen_target: Path, qwen_draft: Path, real_cache: Path
) -> None:
    target = read_gguf_info(qwen_target, cache_dir=real_cache)
    assert (
        target.tokenizer_fingerprint == read_gguf_info(qwen_draft, cache_dir=real_cache).tokenizer_fingerprint
    )
    # Pinned: a fingerprint saved in a config file must mean the same vocabulary next release.
    assert target.tokenizer_fingerprint == "608955a4405dd463"
    assert (target.fim_prefix_id, target.fim_suffix_id, target.fim_middle_id) == (151659, 151661, 151660)


@pytest.mark.slow
def test_second_scan_of_the_real_models_is_fast(
    qwen_target: Path, qwen_draft: Path, gemma: Path, smollm: Path, real_cache: Path
) -> None:
    paths = [qwen_target, qwen_draft, gemma, smollm]
    for path in paths:
        read_gguf_info(path, cache_dir=real_cache)
    start = time.perf_counter()
    for path in paths:
        read_gguf_info(path, cache_dir=real_cache)
    assert time.perf_counter() - start < 1.0


# The header reader against gguf's own GGUFReader.


def test_header_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    from localspec.models.gguf_header import SMALL_ARRAY, read_header

    path = tinymodels.write_tiny_model(tmp_path / "m.gguf", dtype="q8_0", per_layer_arrays=True)
    header = read_header(path)
    reader = gguf.GGUFReader(path)
    assert header.tokens == list(tinymodels.build_vocab().tokens)
    expected = {
        key: field.contents()
        for key, field in reader.fields.items()
        if key != "tokenizer.ggml.tokens" and not key.startswith("GGUF.") and len(field.data) <= SMALL_ARRAY
    }
    assert header.metadata == expected
    assert [(t.name, t.ggml_type, t.n_elements, t.n_bytes) for t in header.tensors] == [
        (t.name, int(t.tensor_type), int(t.n_elements), int(t.n_bytes)) for t in reader.tensors
    ]
    assert header.data_offset == reader.data_offset


def test_big_endian_file(tmp_path: Path) -> None:
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(12)])
    writer.add_tensor("token_embd.weight", np.zeros((12, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = read_gguf_info(path)
    assert (info.n_ctx_train, info.n_embd, info.vocab_size, info.non_layer_bytes) == (128, 8, 12, 12 * 8 * 4)


def test_unknown_version_is_corrupt(tiny_target: Path, tmp_path: Path) -> None:
    data = bytearray(tiny_target.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    path = tmp_path / "v99.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        read_gguf_info(path)


@pytest.mark.slow
def test_first_read_of_a_big_vocabulary_is_fast(qwen_target: Path, tmp_path: Path) -> None:
    # gguf.GGUFReader took 8-15 s for this file on two cores; the struct reader takes ~0.2 s.
    start = time.perf_counter()
    info = read_gguf_info(qwen_target, cache_dir=tmp_path / "cold")
    assert time.perf_counter() - start < 3.0
    assert info.vocab_size == 151936
