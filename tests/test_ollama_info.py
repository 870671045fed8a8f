"""What /api/show says about a model, from its GGUF header alone: template, capabilities, names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tinymodels

from localspec.models.gguf_info import GGUFInfo, read_gguf_info, read_tokens
from localspec.server.ollama_info import capabilities, names_model, ollama_name, parameters
from localspec.server.ollama_template import ollama_template

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def _info(tmp_path: Path, name: str, **kwargs: object) -> tuple[GGUFInfo, list[str]]:
    path = tinymodels.write_tiny_model(tmp_path / f"{name}.gguf", name=name, **kwargs)  # type: ignore[arg-type]
    info = read_gguf_info(path, cache_dir=tmp_path / "cache")
    return info, read_tokens(info, cache_dir=tmp_path / "cache")


def test_chatml_fim_model(tmp_path: Path) -> None:
    vocab = tinymodels.build_vocab(extra_tokens=(tinymodels.IM_START, tinymodels.IM_END, *FIM_TOKENS))
    info, tokens = _info(tmp_path, "coder", vocab=vocab, basename="Tiny-Coder", size_label="3M")
    caps = capabilities(info)
    assert caps == ["completion", "insert"]
    template = ollama_template(info, tokens, caps)
    assert template.startswith("{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}")
    assert "<|im_start|>system" in template and ".Tools" not in template
    # The hook tool calling uses: with the capability, Ollama's Qwen tool instructions appear.
    with_tools = ollama_template(info, tokens, [*caps, "tools"])
    assert (
        "{{- if .Tools }}" in with_tools and "<tool_call>" in with_tools and "{{ .Function }}" in with_tools
    )
    assert ollama_name(info) == "tiny-coder:3m"


def test_plain_model_without_fim_or_chatml(tmp_path: Path) -> None:
    info, tokens = _info(tmp_path, "plain", chat_template=None)
    caps = capabilities(info)
    assert caps == ["completion"]
    template = ollama_template(info, tokens, caps)
    assert ".Suffix" not in template and "<|im_start|>" not in template
    assert template.startswith("{{- if .Messages }}") and "{{ .Role }}: {{ .Content }}" in template
    assert ollama_name(info) is None and not names_model(info, "plain:latest")


def test_names_match_basename_size_and_finetune_words(tmp_path: Path) -> None:
    info, _ = _info(tmp_path, "named", basename="Qwen2.5-Coder", size_label="1.5B")
    info = dataclasses.replace(info, finetune="Instruct", quant="Q4_K_M")
    good = ("qwen2.5-coder:1.5b", "Qwen2.5-Coder:1.5B", "qwen2.5coder:latest", "qwen2.5-coder:1.5b-instruct")
    for name in (*good, "qwen2.5-coder:1.5b-instruct-q4_K_M"):
        assert names_model(info, name), name
    for name in ("qwen2.5-coder:7b", "qwen2.5:1.5b", "qwen2.5-coder:1.5b-base", "qwen2.5-coder:1.5b-q8_0"):
        assert not names_model(info, name), name


def test_parameters_as_ollama_pads_them() -> None:
    assert parameters(4096, ["<|im_end|>"]) == f'{"num_ctx":<30} 4096\n{"stop":<30} "<|im_end|>"'
