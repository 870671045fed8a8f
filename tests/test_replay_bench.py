"""scripts/replay_bench.py: record the bench replies and curves on a tiny model, then replay them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from replaytraces import copy_trace
from scriptmodules import load_script

from localspec.auto import calibrate as cal
from localspec.auto.costmodel import Curve
from localspec.engine.config import LoadOptions
from localspec.engine.drafters.views import numbered_spans
from localspec.engine.llama import LlamaModel


@pytest.fixture(scope="module")
def replay_bench() -> ModuleType:
    return load_script("replay_bench")


def run(module: ModuleType, monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["replay_bench.py", *argv])
    module.main()


def test_calibration_measures_after_any_prefix_and_leaves_the_cache_empty(tiny_target: Path) -> None:
    model = LlamaModel(tiny_target, LoadOptions(n_ctx=512))
    try:
        curve = cal.measure(model, sizes=(1, 2, 4), prefix=200, passes=1)
        assert len(curve.seconds) > 4 and min(curve.seconds) > 0
        assert model.n_past == 0
    finally:
        model.close()


def test_record_then_replay_on_the_tiny_model(
    replay_bench: ModuleType,
    tiny_target: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(
        json.dumps({"one": "the cat sat on the mat", "two": "1\tlorem\n2\tipsum\n3\tdolor"}),
        encoding="utf-8",
    )
    out = tmp_path / "traces.json"
    run(replay_bench, monkeypatch, "record", "--target", str(tiny_target), "--prompts", str(prompts),
        "--max-tokens", "12", "--ctx", "512", "--long-prefix", "100", "--out", str(out))  # fmt: skip
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [t["name"] for t in data["traces"]] == ["one", "two"]
    assert all(0 < len(t["output"]) <= 12 and t["prompt"] for t in data["traces"])
    assert data["long_prefix"] == 100 and len(data["curves"]["short"]) == len(data["curves"]["long"])
    # The prompt's other forms, as the engine builds them: "two" shows numbered lines.
    assert data["traces"][0]["views"] == []
    (view,) = data["traces"][1]["views"]
    assert view["escaped"] is False and view["tokens"]
    # The copy cursor reads the tokens' text, and the drafter the end-of-generation tokens, as in
    # the engine: from the recorded target's file.
    text, ends = replay_bench.token_text(data, None)
    first = data["traces"][0]["output"][0]
    assert text is not None and isinstance(text(first), str) and ends
    gone = replay_bench.token_text({**data, "target": str(tmp_path / "gone.gguf")}, None)
    assert gone == (None, frozenset())
    for flags in ((), ("--context-costs",), ("--no-views",)):
        run(replay_bench, monkeypatch, "replay", str(out), *flags)
        printed = capsys.readouterr().out
        assert "one" in printed and "two" in printed and "geometric mean" in printed
        per_kind = [line for line in printed.splitlines() if "auto / none median" in line]
        assert per_kind and all("geometric mean" in line for line in per_kind)
    run(replay_bench, monkeypatch, "replay", str(out), "--jitter", "3")
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("one", "two"))]
    for row in rows:  # name, prompt tok, reply tok, mean, min, max, ceiling
        mean, low, high = (float(v.rstrip("x")) for v in row[3:6])
        assert low <= mean <= high


def test_the_ceiling_looks_up_the_recorded_views_as_auto_does(replay_bench: ModuleType) -> None:
    # A file shown numbered, written back: only the unnumbered view drafts past a line's end, so a
    # ceiling without it read under what auto reached on the agent set.
    shown, plain = "     1\tx = 1\n     2\ty = 2\n     3\tz = 3\n", "x = 1\ny = 2\nz = 3\n"
    text = "cat -n f.py\n" + shown
    chars = [ord(c) for c in text]
    skipped = [i for a, b in numbered_spans(text) for i in range(a, b)]
    view = {"tokens": [ord(c) for c in plain], "escaped": False}
    trace = {"prompt": chars, "views": [view], "skipped": skipped}
    reply = [*chars, *(ord(c) for c in "x = 1\n")]
    for views, drafted in ((True, "y = 2\n"), (False, "")):
        for drafter in replay_bench.ceiling_lookups(trace, views, chr, frozenset())():
            drafter.start(chars)
            assert "".join(map(chr, drafter.peek(reply, 6).tokens)).startswith(drafted)
            assert views or "y = 2" not in "".join(map(chr, drafter.peek(reply, 6).tokens))


def test_jitter_moves_every_timed_point_a_little_and_seed_0_not_at_all(replay_bench: ModuleType) -> None:
    curves = {"sizes": [1, 2, 4], "short": [0.01, 0.02, 0.03], "long": [0.02, 0.03, 0.05]}
    data = {"curves": curves, "traces": []}
    assert replay_bench.jittered(data, 0) is data
    one, two = replay_bench.jittered(data, 1), replay_bench.jittered(data, 2)
    assert one["curves"]["sizes"] == [1, 2, 4] and data["curves"] is curves  # the recording kept
    for name in ("short", "long"):
        moved = [a / b for a, b in zip(one["curves"][name], curves[name], strict=True)]
        assert all(r != 1.0 and abs(r - 1.0) < 0.2 for r in moved)
        assert one["curves"][name] != two["curves"][name]
    assert replay_bench.jittered(data, 1) == one  # a seed is one machine, every time


def test_jitter_needs_at_least_the_recorded_machine(
    replay_bench: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        run(replay_bench, monkeypatch, "replay", str(tmp_path / "traces.json"), "--jitter", "0")
    assert refused.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as helped:  # the help text formats (its "%" escaped)
        run(replay_bench, monkeypatch, "replay", "--help")
    assert helped.value.code == 0 and "N(0, 3%)" in capsys.readouterr().out


def test_context_costs_charge_a_long_prompt_more(
    replay_bench: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A whole-file copy behind a 2,000-token prompt: each of its wide verifies attends over the
    # prompt, so charged for its context the copy gains less over plain decoding.
    short = Curve.from_points(
        {1: 0.03, 2: 0.05, 4: 0.08, 8: 0.13, 16: 0.15, 32: 0.26, 48: 0.30, 64: 0.36}, 64
    )
    long = Curve.from_points(
        {1: 0.033, 2: 0.06, 4: 0.10, 8: 0.17, 16: 0.21, 32: 0.38, 48: 0.48, 64: 0.45}, 64
    )
    trace = copy_trace(120)
    prompt = [*range(10_000, 12_000), *trace.prompt]
    data = {
        "max_tokens": 120,
        "long_prefix": 1200,
        "curves": {
            "sizes": [1, 2, 4, 8, 16, 32, 48, 64],
            "short": list(short.seconds),
            "long": list(long.seconds),
        },
        "traces": [{"name": "copy", "kind": "code_edit", "prompt": prompt, "output": list(trace.output)}],
    }
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    ratios = []
    for flags in ((), ("--context-costs",), ("--no-views",)):
        run(replay_bench, monkeypatch, "replay", str(path), *flags)
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("copy"))
        ratios.append(float(row.split()[3].rstrip("x")))
    assert ratios[0] > ratios[1] > 1.0


def test_a_width_timed_faster_after_the_long_prefix_adds_nothing(replay_bench: ModuleType) -> None:
    # Timing noise on a tiny model: the long prefix's decode of 2 came out faster than the short's.
    curves = {"sizes": [1, 2], "short": [0.010, 0.020], "long": [0.012, 0.015]}
    m = replay_bench.machine({"curves": curves, "long_prefix": 116}, context_costs=True)
    assert m.per_context is not None
    assert m.verify_at(1, 116) == pytest.approx(0.012)
    assert m.verify_at(2, 116) == pytest.approx(0.020, rel=1e-4)
