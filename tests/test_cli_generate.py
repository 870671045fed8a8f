"""`localspec generate` and `localspec bench` driven through click on the tiny models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tinymodels
from click.testing import CliRunner

from localspec.cli import cli
from localspec.process.hugepages import huge_pages

ONE_THREAD = ["--threads", "1", "--ctx", "512"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def generate_json(target: Path, *, max_tokens: int) -> list[str]:
    """`generate "hello world" --json` on `target`, one thread."""
    return [
        "generate",
        "hello world",
        "--target",
        str(target),
        "--max-tokens",
        str(max_tokens),
        "--json",
        *ONE_THREAD,
    ]


def test_generate_streams_text_and_prints_stats(tiny_target: Path, tiny_perfect_draft: Path) -> None:
    code, out, err = invoke(
        "generate",
        "hello world",
        "--target",
        str(tiny_target),
        "--draft",
        str(tiny_perfect_draft),
        "--method",
        "draft",
        "--max-tokens",
        "24",
        *ONE_THREAD,
    )
    assert code == 0, err
    assert out.strip()
    stats_line = err.strip().splitlines()[-1]
    assert "tok/s" in stats_line and "method draft" in stats_line and "accepted" in stats_line


def test_loading_mode_is_fast_by_default_exact_when_asked_and_reported(
    tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    args = generate_json(tiny_target, max_tokens=8)
    code, out, err = invoke(*args, "--draft", str(tiny_perfect_draft), "--method", "draft")
    assert code == 0, err
    assert json.loads(out)["stats"]["exact"] is False
    code, out, err = invoke(*args, "--method", "none", "--exact")
    assert code == 0, err
    assert json.loads(out)["stats"]["exact"] is True
    code, out, err = invoke(*args, "--method", "none", "--fast")  # the default, said explicitly
    assert code == 0, err
    assert json.loads(out)["stats"]["exact"] is False
    text_args = [a for a in args if a != "--json"]
    code, _, err = invoke(*text_args, "--method", "none")
    assert code == 0, err
    last = err.strip().splitlines()[-1]
    assert last.endswith("; fast: identical to the target alone up to rounding (--exact for bit-identity)")
    code, _, err = invoke(*text_args, "--method", "none", "--exact")
    assert code == 0, err
    assert err.strip().splitlines()[-1].endswith("; exact: bit-identical to the target alone")


def test_generate_json_has_text_tokens_and_stats(tiny_target: Path, tiny_perfect_draft: Path) -> None:
    args = generate_json(tiny_target, max_tokens=16)
    code, out, _ = invoke(*args, "--method", "none")
    base = json.loads(out)
    code2, out2, _ = invoke(*args, "--draft", str(tiny_perfect_draft), "--method", "draft", "-k", "3")
    spec = json.loads(out2)
    assert code == code2 == 0
    assert spec["tokens"] == base["tokens"] and spec["text"] == base["text"]
    for key in ("tokens_per_second", "ttft_s", "method", "drafted", "accepted", "acceptance_rate", "mean_k"):
        assert key in spec["stats"]
    assert spec["stats"]["method"] == "draft" and spec["stats"]["acceptance_rate"] == 1.0
    assert spec["stats"]["k"] == 3 and 1.0 <= spec["stats"]["mean_k"] <= 3.0
    code3, out3, _ = invoke(*args, "--draft", str(tiny_perfect_draft), "--method", "draft")
    assert code3 == 0 and json.loads(out3)["stats"]["k"] == 4  # no -k: a fixed method's default


def test_generate_sampling_is_reproducible_with_a_seed(tiny_target: Path) -> None:
    args = [
        "generate",
        "hello",
        "--target",
        str(tiny_target),
        "--temperature",
        "0.8",
        "--seed",
        "5",
        "--max-tokens",
        "16",
        "--json",
        *ONE_THREAD,
    ]
    assert json.loads(invoke(*args)[1])["tokens"] == json.loads(invoke(*args)[1])["tokens"]


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda d: d / "missing.gguf", "not found"),
        (lambda d: d, "directory"),
        (lambda d: _write(d / "notes.gguf", b"hello, not a model"), "not a GGUF"),
    ],
)
def test_bad_target_is_one_line_and_exit_2(tmp_path: Path, make: object, expect: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    code, out, err = invoke("generate", "hi", "--target", str(path), *ONE_THREAD)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and expect in err
    assert "Traceback" not in err + out


def test_truncated_target_is_refused_cleanly(tmp_path: Path, tiny_target: Path) -> None:
    truncated = _write(tmp_path / "cut.gguf", tiny_target.read_bytes()[:40_000])
    code, out, err = invoke("generate", "hi", "--target", str(truncated), *ONE_THREAD)
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err + out


def test_bench_compares_every_method_with_none(
    tmp_path: Path, tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    prompts = _write(tmp_path / "p.json", json.dumps({"a": "hello world", "b": "def add(a, b):"}).encode())
    args = [
        "bench",
        "--target",
        str(tiny_target),
        "--draft",
        str(tiny_perfect_draft),
        "--prompts",
        str(prompts),
        "--max-tokens",
        "24",
        "--json",
    ]
    code, out, err = invoke(*args, "--methods", "draft,ngram", *ONE_THREAD)
    assert code == 0, err
    report = json.loads(out)
    assert report["settings"]["max_tokens"] == 24 and report["settings"]["methods"] == ["draft", "ngram"]
    assert report["settings"]["huge_pages"] is huge_pages()  # this process's: the speed depends on it
    assert set(report["prompts"]) == {"a", "b"}
    for entry in report["prompts"].values():
        assert entry["kind"] == "other"
        rows = entry["methods"]
        assert set(rows) == {"none", "draft", "ngram"}
        for row in rows.values():
            assert row["identical_to_none"] is True and row["text"] == rows["none"]["text"]
            assert row["decode_tps"] > 0 and row["e2e_tps"] > 0 and row["ttft_s"] > 0
        assert rows["none"]["speedup_vs_none"] == 1.0
        ratio = rows["draft"]["decode_tps"] / rows["none"]["decode_tps"]
        assert rows["draft"]["speedup_vs_none"] == pytest.approx(ratio, rel=1e-3, abs=1e-3)
        assert rows["draft"]["acceptance_rate"] == 1.0
        assert rows["draft"]["k"] == 4 and 1.0 <= rows["draft"]["mean_k"] <= 4.0
        assert (rows["none"]["k"], rows["none"]["mean_k"]) == (0, 0.0)
    assert set(report["kinds"]) == {"other", "all"}
    assert report["kinds"]["other"]["draft"]["prompts"] == 2
    table = invoke(*args[: args.index("--json")], *ONE_THREAD, "--methods", "draft", "-k", "2")
    assert table[0] == 0, table[2]
    header, *lines = table[1].splitlines()[:5]
    assert header.split()[3:6] == ["decode", "e2e", "ttft"]
    assert header.split()[-3:] == ["mean", "k", "same"] and len(lines) == 4
    assert all(float(line.split()[-2]) <= 2.0 for line in lines)
    assert "median per kind" in table[1]


def test_bench_runs_the_bench_set_format_filtered_by_kind(tmp_path: Path, tiny_target: Path) -> None:
    entries = [
        {"name": "e", "kind": "code_edit", "source": "t", "messages": [{"role": "user", "content": "x = 1"}]},
        {"name": "c", "kind": "chat", "source": "t", "messages": [{"role": "user", "content": "hello"}]},
    ]
    prompts = _write(tmp_path / "set.json", json.dumps({"prompts": entries}).encode())
    args = ["bench", "--target", str(tiny_target), "--prompts", str(prompts), "--max-tokens", "8"]
    code, out, err = invoke(*args, "--methods", "ngram", "--kinds", "chat", "--json", *ONE_THREAD)
    assert code == 0, err
    report = json.loads(out)
    assert list(report["prompts"]) == ["c"] and report["prompts"]["c"]["kind"] == "chat"
    code, out, err = invoke(*args, "--kinds", "poetry", *ONE_THREAD)
    assert code == 2 and "no prompts of kind poetry; this set has code_edit, chat" in err
    assert "Traceback" not in err + out


def test_bench_rejects_an_unknown_method(tiny_target: Path) -> None:
    code, _, err = invoke("bench", "--target", str(tiny_target), "--methods", "draft,magic", *ONE_THREAD)
    assert code == 2 and "magic" in err


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_generate_remote_uses_the_running_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    from daemonproc import start_daemon

    # Penalised, so the penalties are seen to travel to the daemon as well.
    penalties = ("--repeat-penalty", "1.8", "--frequency-penalty", "0.5", "--repeat-last-n", "-1")

    def here(*extra: str) -> Any:
        args = ["hello world", "--target", str(tiny_target), "--max-tokens", "16", "--json", *extra]
        return json.loads(invoke("generate", *args, "--method", "none", *ONE_THREAD)[1])

    local = here(*penalties)
    assert here()["tokens"] != local["tokens"]
    home = tmp_path / "daemon-home"
    daemon = start_daemon(home, tiny_target, "--draft", str(tiny_perfect_draft), ctx=512)
    try:
        monkeypatch.setenv("LOCALSPEC_HOME", str(home))
        code, out, err = invoke(
            "generate",
            "hello world",
            "--remote",
            "--max-tokens",
            "16",
            "--json",
            "--method",
            "draft",
            "-k",
            "3",
            *penalties,
        )
        assert code == 0, err + daemon.log()
        remote = json.loads(out)
        assert remote["tokens"] == local["tokens"]
        assert remote["stats"]["method"] == "draft" and remote["stats"]["drafted"] > 0
    finally:
        assert daemon.stop() == 0


def test_generate_remote_without_a_daemon_says_how_to_start_one() -> None:
    code, _, err = invoke("generate", "hi", "--remote")
    assert code == 2 and "localspec serve" in err and err.count("\n") == 1


def test_generate_shows_a_thinking_models_reasoning_apart(tmp_path: Path) -> None:
    """The reasoning to stderr (a person sees the model think), the answer alone to stdout (a pipe
    gets it); --json carries both."""
    target = tinymodels.write_thinking_target(tmp_path / "think.gguf")
    code, out, err = invoke(
        "generate", "hi there", "--target", str(target), "--max-tokens", "20", *ONE_THREAD
    )
    assert code == 0, err
    assert out.strip() == "python function"
    assert "hello world\n" in err.splitlines(keepends=True)
    code, out, err = invoke(*generate_json(target, max_tokens=20))
    assert code == 0, err
    answer = json.loads(out)
    assert (answer["reasoning"], answer["text"]) == ("hello world", "python function")
