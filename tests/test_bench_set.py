"""The bench set: the committed file, its reproducible build, and reading either prompts format."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.engine.bench import load_prompts
from localspec.engine.benchset import (
    UNSORTED,
    BenchPrompt,
    load_bench_set,
    load_selected,
    parse_bench_set,
    select_kinds,
)
from localspec.engine.drafters.views import json_decoded, unnumbered_text
from localspec.errors import UserInputError

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import benchset_sources  # noqa: E402
import make_agent_set  # noqa: E402
import make_bench_set  # noqa: E402
import make_long_set  # noqa: E402

BENCH_SET = SCRIPTS / "bench_set.json"
KINDS = {"code_edit", "code_write", "summarize", "qa", "translate", "chat", "math"}


def test_the_committed_set_has_every_kind_with_sources() -> None:
    prompts = load_bench_set(BENCH_SET)
    assert len(prompts) >= 24
    by_kind = {k: [p for p in prompts if p.kind == k] for k in {p.kind for p in prompts}}
    assert set(by_kind) == KINDS
    assert all(len(group) >= 3 for group in by_kind.values())
    assert all(p.source and p.messages[-1].role == "user" for p in prompts)
    # Code edits are of real files, cited with their version and licence.
    assert all("(PSF-2.0)" in p.source or "(BSD-3-Clause)" in p.source for p in by_kind["code_edit"])


def test_the_committed_set_is_what_the_script_builds() -> None:
    if benchset_sources.installed_versions() != benchset_sources.BUILT_WITH:
        pytest.skip(f"built from {benchset_sources.BUILT_WITH}, not what is installed here")
    rebuilt = make_bench_set.render(make_bench_set.build())
    assert rebuilt == BENCH_SET.read_text(encoding="utf-8")


def test_the_agent_set_is_the_code_edits_with_their_files_shown_numbered() -> None:
    agent_set = SCRIPTS / "agent_set.json"
    assert make_agent_set.render(make_agent_set.build()) == agent_set.read_text(encoding="utf-8")
    edits = [p for p in load_bench_set(BENCH_SET) if p.kind == "code_edit"]
    prompts = load_bench_set(agent_set)
    assert [p.name for p in prompts] == [e.name.replace("edit_", "agent_") for e in edits]
    shown = [p.messages[-1].content for p in prompts]
    assert all(any(f"     1{mark}" in text for text in shown) for mark in ("\t", "→", ":"))
    for edit, agent, text in zip(edits, prompts, shown, strict=True):
        # The same file and ask: the engine's unnumbered form of the prompt holds the file as it was.
        file = edit.messages[-1].content.split("```python\n")[-1].removesuffix("\n```")
        unnumbered = unnumbered_text(text)
        assert unnumbered is not None and unnumbered.endswith(f"\n{file}"), agent.name
        assert text.startswith(edit.messages[-1].content.split("\n\n```python")[0])


def test_the_agent_json_set_is_the_code_edits_with_their_files_in_a_json_result() -> None:
    json_set = SCRIPTS / "agent_json_set.json"
    assert make_agent_set.render(make_agent_set.build_json()) == json_set.read_text(encoding="utf-8")
    edits = [p for p in load_bench_set(BENCH_SET) if p.kind == "code_edit"]
    prompts = load_bench_set(json_set)
    assert [p.name for p in prompts] == [e.name.replace("edit_", "agent_json_") for e in edits]
    for edit, agent in zip(edits, prompts, strict=True):
        # The same file and ask; the engine's decoded form of the prompt holds the file as it was,
        # in both tools' results (the shell's numbered by `cat -n` inside the string).
        text = agent.messages[-1].content
        file = edit.messages[-1].content.split("```python\n")[-1].removesuffix("\n```")
        assert "\n     1\t" not in text and f"\n{file}" not in text, agent.name
        decoded = json_decoded(text)
        assert decoded is not None, agent.name
        assert f"\n{file}" in (unnumbered_text(decoded.text) or decoded.text), agent.name
        assert text.startswith(edit.messages[-1].content.split("\n\n```python")[0])


def test_the_older_name_to_text_format_still_loads() -> None:
    old = SCRIPTS / "bench_prompts.json"
    prompts = load_bench_set(old)
    texts = json.loads(old.read_text())
    assert [p.name for p in prompts] == list(texts)
    assert all(p.kind == UNSORTED and p.messages[0].content == texts[p.name] for p in prompts)
    assert load_prompts(old) == texts


def test_load_prompts_reads_the_new_format_as_name_to_user_message() -> None:
    prompts = load_bench_set(BENCH_SET)
    assert load_prompts(BENCH_SET) == {p.name: p.messages[-1].content for p in prompts}


def _entry(**changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": "a",
        "kind": "chat",
        "source": "here",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    }
    entry.update(changes)
    return entry


def test_an_entry_keeps_its_kind_source_and_every_message() -> None:
    (prompt,) = parse_bench_set({"prompts": [_entry()]})
    assert (prompt.name, prompt.kind, prompt.source) == ("a", "chat", "here")
    assert [(m.role, m.content) for m in prompt.messages] == [("system", "be brief"), ("user", "hi")]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([1, 2], "must be"),
        ({"prompts": []}, "no prompts"),
        ({"prompts": [5]}, "prompt 0 must be an object"),
        ({"prompts": [_entry(name="")]}, "'name'"),
        ({"prompts": [_entry(kind=3)]}, "'kind'"),
        ({"prompts": [_entry(source=["x"])]}, "'source'"),
        ({"prompts": [_entry(messages=[])]}, "'messages'"),
        ({"prompts": [_entry(messages=[{"role": "robot", "content": "x"}])]}, "role"),
        ({"prompts": [_entry(messages=[{"role": "user", "content": 1}])]}, "content"),
        ({"prompts": [_entry(messages=[{"role": "assistant", "content": "x"}])]}, "last message"),
        ({"prompts": [_entry(), _entry()]}, "appears twice"),
        ({"a": "fine", "b": 2}, "must be"),
    ],
)
def test_a_malformed_set_is_refused_in_one_line(data: object, says: str) -> None:
    with pytest.raises(UserInputError) as err:
        parse_bench_set(data, "set.json")
    assert says in err.value.message and "\n" not in err.value.message
    assert err.value.message.startswith("set.json")


def test_an_unreadable_file_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserInputError, match="cannot read prompts file"):
        load_bench_set(bad)
    with pytest.raises(UserInputError, match="cannot read prompts file"):
        load_bench_set(tmp_path / "missing.json")


def test_kinds_filter_keeps_order_and_names_a_missing_kind() -> None:
    prompts = [
        BenchPrompt.user("a", "x", "chat"),
        BenchPrompt.user("b", "y", "math"),
        BenchPrompt.user("c", "z"),
    ]
    assert [p.name for p in select_kinds(prompts, ["math", "chat"])] == ["a", "b"]
    with pytest.raises(UserInputError, match="no prompts of kind poetry; this set has chat, math, other"):
        select_kinds(prompts, ["chat", "poetry"])


def test_load_selected_reads_kinds_as_the_command_line_gives_them(tmp_path: Path) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps({"a": "x", "b": "y"}))
    assert [p.name for p in load_selected(path)] == ["a", "b"]
    assert [p.name for p in load_selected(path, " other , ")] == ["a", "b"]
    with pytest.raises(UserInputError, match="no prompts of kind edit"):
        load_selected(path, "edit")


@pytest.mark.parametrize("script", ["head_to_head.py", "llama_server_compare.py", "lossless_check.py"])
def test_scripts_name_a_missing_kind_in_one_line(script: str) -> None:
    argv = [sys.executable, str(SCRIPTS / script), "--kinds", "edit"]
    if script != "lossless_check.py":
        argv += ["--server", "/nonexistent/llama-server"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=SCRIPTS.parent)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "no prompts of kind edit; this set has code_edit, code_write, summarize, qa, translate, chat, math"
    ]


SAMPLE = benchset_sources.Text(
    '"""Doc."""\n\n\ndef clamp(x, lo, hi):\n    """Keep x in [lo, hi]."""\n'
    "    if x < lo:\n        return lo\n"
    "    if x > hi:\n        return hi\n    return x\n\n\ndef tail(items, n):\n    out = []\n"
    "    for i in range(len(items)):\n        if i >= len(items) - n:\n            out.append(items[i])\n"
    "    return out\n",
    "sample.py",
)


def test_an_injected_bug_changes_one_comparison_and_names_its_function() -> None:
    for seed in range(6):
        buggy, function = benchset_sources.inject_off_by_one(SAMPLE, random.Random(seed))
        changed = [
            (a, b) for a, b in zip(SAMPLE.body.splitlines(), buggy.body.splitlines(), strict=True) if a != b
        ]
        assert len(changed) == 1
        before, after = changed[0]
        assert {before.strip(), after.strip()} in [
            {"if x < lo:", "if x <= lo:"},
            {"if x > hi:", "if x >= hi:"},
            {"if i >= len(items) - n:", "if i > len(items) - n:"},
        ]
        assert function == ("tail" if "items" in before else "clamp")
        ast.parse(buggy.body)
        assert buggy.cite.startswith("sample.py, with")


def test_a_blanked_body_keeps_the_docstring_and_parses() -> None:
    holed, function = benchset_sources.blank_body(SAMPLE, random.Random(0))
    assert function in {"clamp", "tail"}
    assert "...  # TODO: write this body" in holed.body
    assert ('"""Keep x in [lo, hi]."""' in holed.body) and ast.parse(holed.body)
    assert len(holed.body.splitlines()) < len(SAMPLE.body.splitlines())


def test_head_statements_keeps_whole_statements_within_budget() -> None:
    cut = benchset_sources.head_statements(SAMPLE, budget=150)
    assert len(cut.body) <= 150 and "def clamp" in cut.body and "def tail" not in cut.body
    ast.parse(cut.body)
    assert cut.cite == "sample.py, lines 1-10"
    assert benchset_sources.head_statements(SAMPLE, budget=10_000).cite == "sample.py"


@pytest.mark.slow
def test_every_prompt_fits_the_context_with_512_tokens_to_spare(qwen_target: Path) -> None:
    from localspec.engine.config import LoadOptions
    from localspec.engine.llama import LlamaModel
    from localspec.engine.prompting import prompt_tokens
    from localspec.types import GenerationRequest

    model = LlamaModel(qwen_target, LoadOptions(n_ctx=256, n_threads=1))
    try:
        sizes = {
            p.name: len(prompt_tokens(model, GenerationRequest(messages=p.messages, max_tokens=1)))
            for p in load_bench_set(BENCH_SET)
        }
    finally:
        model.close()
    assert max(sizes.values()) <= 1100, sizes


def test_the_long_set_builds_from_the_standard_library() -> None:
    data = make_long_set.build()
    prompts = parse_bench_set(data, "long set")
    assert [p.name for p in prompts] == [
        "long_edit_configparser",
        "long_qa_reference",
        "long_summarize_json",
        "long_agent_shlex",
    ]
    # Each holds whole files: tens of thousands of characters, thousands of tokens.
    assert all(sum(len(m.content) for m in p.messages) > 20_000 for p in prompts)
    assert "class RawConfigParser" in prompts[0].messages[0].content
    assert prompts[3].messages[0].role == "system" and "class shlex" in prompts[3].messages[1].content
