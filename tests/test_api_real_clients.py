"""Editor-facing routes on the real Qwen2.5-Coder 1.5B: FIM and repository tokens, a real template.

/infill is driven with the bytes llama.vim sends; /api/show with the `ollama` package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemonproc import Daemon, start_real_daemon
from test_api_infill import LLAMA_VIM_ACCEPTS, curl_post, llama_vim_fim, vim_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CTX = 4096
PREFIX = "def add(a, b):\n"
SUFFIX = "\n\n\nprint(add(2, 3))\n"


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, qwen_target: Path, qwen_draft: Path, daemon_curves: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("real-home")
    draft = ("--draft", str(qwen_draft))
    d = start_real_daemon(home, qwen_target, *draft, tcp=True, ctx=CTX, curves=daemon_curves)
    yield d
    assert d.stop() == 0, d.log()


def test_show_describes_qwen_as_ollama_would(daemon: Daemon) -> None:
    with daemon.ollama() as c:
        shown = c.show("qwen2.5-coder:1.5b")
        assert c.show("qwen2.5-coder:1.5b-instruct-q4_K_M").template == shown.template
    assert shown.capabilities == ["completion", "insert", "tools"]  # Qwen's template renders tools
    template = shown.template or ""
    assert template.startswith(
        "{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>"
    )
    assert "<|im_start|>assistant" in template and "{{- if .Tools }}" in template
    info = shown.modelinfo or {}
    assert info["qwen2.context_length"] == CTX  # served, not the GGUF's 32768
    assert info["general.basename"] == "Qwen2.5-Coder" and info["general.size_label"] == "1.5B"
    assert (
        shown.details is not None
        and shown.details.family == "qwen2"
        and shown.details.parameter_size == "1.5B"
    )
    assert re.search(rf"^num_ctx +{CTX}$", shown.parameters or "", re.M)
    assert re.search(r'^stop +"<\|im_end\|>"$', shown.parameters or "", re.M)


def test_llama_vim_completes_code_at_the_cursor(daemon: Daemon) -> None:
    assert daemon.port is not None
    body = json.loads(llama_vim_fim(PREFIX, "    return ", SUFFIX))
    greedy = vim_json({**body, "samplers": ["temperature"], "temperature": 0, "t_max_predict_ms": 5000})
    status, raw = curl_post(daemon.port, "/infill", greedy)
    assert status == 200 and all(p.search(raw) for p in LLAMA_VIM_ACCEPTS), raw
    content = json.loads(raw)["content"]
    assert content.replace(" ", "").startswith("a+b"), content


def test_other_files_reach_the_prompt_through_repository_tokens(daemon: Daemon) -> None:
    base = {"input_prefix": PREFIX, "prompt": "    return ", "input_suffix": SUFFIX, "n_predict": 0}
    extra = [{"filename": "ops.py", "text": "def mul(a, b):\n    return a * b\n"}]
    with daemon.http() as http:
        alone = http.post("/infill", json=base).json()["tokens_evaluated"]
        with_file = http.post("/infill", json={**base, "input_extra": extra}).json()["tokens_evaluated"]
    # <|repo_name|>myproject\n <|file_sep|>ops.py\n ...file... <|file_sep|>filename\n: well over ten tokens.
    assert with_file - alone > 10


def test_time_limit_ends_at_a_line_end(daemon: Daemon) -> None:
    body = {"input_prefix": "def fib(n):\n", "input_suffix": "\n", "n_predict": 200, "temperature": 0,
            "t_max_predict_ms": 1}  # fmt: skip
    with daemon.http() as http:
        out = http.post("/infill", json=body).json()
    content = out["content"]
    # Past 1 ms of generation, the first newline ends it: nothing but whitespace after it.
    assert "\n" in content and content.split("\n", 1)[1].strip() == "", content
    assert out["stop_type"] == "limit" and out["tokens_predicted"] < 200


def test_n_indent_keeps_the_completion_inside_its_block(daemon: Daemon) -> None:
    body = {"input_prefix": "class Point:\n    def __init__(self, x, y):\n", "prompt": "        ",
            "input_suffix": "\n", "n_predict": 96, "temperature": 0}  # fmt: skip
    with daemon.http() as http:
        free = http.post("/infill", json=body).json()["content"]
        kept = http.post("/infill", json={**body, "n_indent": 8}).json()["content"]
    shallow = [line for line in free.split("\n")[1:] if line.strip() and len(line) - len(line.lstrip()) < 8]
    assert shallow, free  # left alone, the model goes on past the constructor
    assert free.startswith(kept) and len(kept) < len(free)
    assert all(len(line) - len(line.lstrip()) >= 8 for line in kept.split("\n")[1:] if line), kept
