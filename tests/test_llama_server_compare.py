"""The llama-server comparison's pure parts: modes, requests, replies, its JSON, and the goals report.

No llama-server is started: the replies are shaped as the vendored server writes them
(tools/server/server-common.cpp, server_slot_stats::to_json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from localspec.engine.bench import BenchRow
from localspec.engine.bench import report_json as bench_json
from localspec.engine.benchset import BenchPrompt
from localspec.types import ChatMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_report
import server_runs
from server_runs import Sample


def test_modes_start_with_plain_and_draft_gives_one_mode_per_k() -> None:
    modes = server_runs.mode_args(["ngram-mod", "draft", "ngram-simple"], Path("d.gguf"), [3, 5], 4)
    assert list(modes) == ["plain", "ngram-mod", "draft-k3", "draft-k5", "ngram-simple"]
    assert modes["plain"] == []
    assert modes["ngram-mod"] == ["--spec-type", "ngram-mod"]
    assert modes["ngram-simple"] == ["--spec-type", "ngram-simple"]
    assert modes["draft-k5"] == [
        *["-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "5", "-td", "4"]
    ]
    with pytest.raises(ValueError, match=r"unknown mode\(s\) eagle; choose from plain, ngram-mod"):
        server_runs.mode_args(["eagle"], Path("d.gguf"), [3], 4)


def test_the_request_sends_every_message_greedy_without_the_prompt_cache() -> None:
    prompt = BenchPrompt("p", "chat", (ChatMessage("system", "be brief"), ChatMessage("user", "hi")))
    body = server_runs.request_body(prompt, 64)
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (body["max_tokens"], body["temperature"], body["cache_prompt"]) == (64, 0.0, False)


def _reply(text: str = "def f(): pass", tokens: int = 41, **timings: float) -> dict[str, Any]:
    stats = {
        "cache_n": 0,
        "prompt_n": 120,
        "prompt_ms": 250.0,
        "prompt_per_token_ms": 2.08,
        "prompt_per_second": 480.0,
        "predicted_n": tokens,
        "predicted_ms": 2000.0,
        "predicted_per_token_ms": 50.0,
        "predicted_per_second": 20.0,
    } | timings
    return {
        "choices": [
            {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": text}}
        ],
        "usage": {"completion_tokens": tokens, "prompt_tokens": 120, "total_tokens": 120 + tokens},
        "timings": stats,
    }


def test_a_reply_gives_the_servers_decode_speed_its_prompt_time_and_the_wall_speed() -> None:
    sample = server_runs.parse_reply(_reply(draft_n=30, draft_n_accepted=21), wall_s=2.5)
    assert sample == Sample("def f(): pass", 41, 20.0, 16.4, 0.25, 30, 21)
    # No draft fields when the server drafted nothing.
    assert server_runs.parse_reply(_reply(), wall_s=2.0).drafted == 0
    # Stopped on its end-of-generation token, which usage counts and the text lacks: 41 tokens of text.
    stopped = _reply()
    stopped["choices"][0]["finish_reason"] = "stop"
    stopped["usage"]["completion_tokens"] = 42
    assert server_runs.parse_reply(stopped, wall_s=2.5).tokens == 41
    assert server_runs.parse_reply(stopped, wall_s=2.5).e2e_tps == 16.4


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ({"error": {"code": 400, "message": "the request exceeds the context size", "type": "x"}}, "context"),
        ({"choices": [], "usage": {"completion_tokens": 1}, "timings": {}}, "lacks"),
        ({k: v for k, v in _reply().items() if k != "timings"}, "lacks 'timings'"),
    ],
)
def test_an_error_or_a_reply_without_timings_is_refused(reply: dict[str, Any], says: str) -> None:
    with pytest.raises(server_runs.ServerReplyError, match=says):
        server_runs.parse_reply(reply, wall_s=1.0)


def _sample(
    decode: float, text: str = "same", ttft: float = 0.2, drafted: int = 0, accepted: int = 0
) -> Sample:
    return Sample(text, 100, decode, decode * 0.8, ttft, drafted, accepted)


def test_the_fastest_turn_is_kept_with_the_spread_and_compared_with_plain() -> None:
    turns = [_sample(20.0, drafted=50, accepted=40), _sample(25.0, drafted=40, accepted=30), _sample(22.0)]
    best, spread = server_runs.fastest(turns)
    assert best.decode_tps == 25.0 and spread == 0.2
    row = server_runs.mode_row(turns, plain=_sample(18.0, text="other"))
    assert row["decode_tps"] == 25.0 and row["acceptance_rate"] == 0.75 and row["spread"] == 0.2
    assert row["identical_to_plain"] is False
    assert server_runs.mode_row([_sample(9.0)], plain=_sample(18.0))["identical_to_plain"] is True


PROMPTS = [
    BenchPrompt.user("edit1", "x", "code_edit"),
    BenchPrompt.user("edit2", "x", "code_edit"),
    BenchPrompt.user("chat1", "x", "chat"),
]


def _server_json() -> dict[str, Any]:
    runs = {
        "edit1": {"plain": [_sample(20.0)], "ngram-mod": [_sample(40.0)], "draft-k3": [_sample(30.0)]},
        "edit2": {"plain": [_sample(20.0)], "ngram-mod": [_sample(25.0)], "draft-k3": [_sample(35.0)]},
        "chat1": {"plain": [_sample(20.0)], "ngram-mod": [_sample(19.0)], "draft-k3": [_sample(24.0)]},
    }
    settings = {
        "max_tokens": 256,
        "started": "2026-11-23T10:00:00+0000",
        "finished": "2026-11-23T10:20:00+0000",
    }
    return server_runs.report_json(PROMPTS, runs, settings)


def test_the_server_json_has_a_row_per_mode_and_medians_per_kind() -> None:
    data = _server_json()
    assert data["prompts"]["edit2"]["kind"] == "code_edit"
    assert data["prompts"]["edit2"]["modes"]["draft-k3"]["decode_tps"] == 35.0
    assert data["kinds"]["code_edit"]["draft-k3"] == {
        "prompts": 2,
        "decode_tps": 32.5,
        "e2e_tps": 26.0,
        "ttft_s": 0.2,
    }
    assert data["kinds"]["all"]["plain"]["prompts"] == 3


def _row(decode: float, ttft: float = 0.2, text: str = "same") -> BenchRow:
    return BenchRow(
        decode_tps=decode,
        e2e_tps=decode * 0.8,
        ttft_s=ttft,
        spread=0.0,
        speedup_vs_none=0.0,
        acceptance_rate=0.0,
        identical_to_none=True,
        tokens=100,
        drafted=0,
        accepted=0,
        mean_accepted_length=0.0,
        k=0,
        mean_k=0.0,
        redecided=0,
        exact=False,
        python_share=0.0,
        method_steps={},
        fallback_reason=None,
        text=text,
    )


def _localspec_json(**rows: dict[str, BenchRow]) -> dict[str, Any]:
    report = {
        "edit1": {"none": _row(19.8), "auto": _row(48.0)},
        "edit2": {"none": _row(20.2), "auto": _row(36.0)},
        "chat1": {"none": _row(19.0, ttft=0.22, text="other"), "auto": _row(18.0)},
    } | rows
    settings = {
        "max_tokens": 256,
        "started": "2026-11-23T10:21:00+0000",
        "finished": "2026-11-23T10:40:00+0000",
    }
    return bench_json(PROMPTS, report, settings)


def test_each_prompt_is_held_to_the_goals() -> None:
    comparison = bench_report.compare(_localspec_json(), _server_json())
    edit1, edit2, chat1 = comparison.prompts
    assert edit1.ratios == {
        "none_vs_plain": 0.99,
        "ttft_vs_plain": 1.0,
        "auto_vs_none": 2.424,
        "auto_vs_best_spec": 1.2,
    }
    assert edit1.best_spec == "ngram-mod" and edit2.best_spec == "draft-k3"
    assert edit1.missed == [] and edit1.same_text_as_plain is True
    # chat1: none is 0.95x plain's decode and 1.1x its TTFT, auto is 0.947x none and 0.75x the best draft.
    assert chat1.ratios == {
        "none_vs_plain": 0.95,
        "ttft_vs_plain": 1.1,
        "auto_vs_none": 0.947,
        "auto_vs_best_spec": 0.75,
    }
    assert len(chat1.missed) == 4 and chat1.same_text_as_plain is False
    assert comparison.kinds["code_edit"]["auto_vs_best_spec"] == pytest.approx((1.2 + 1.029) / 2, abs=1e-3)
    # The code-edit median (1.114) misses its 1.15 goal although each code edit beats 1.0.
    assert comparison.missed[:4] == chat1.missed
    assert (
        comparison.missed[4].startswith("code_edit: median over code edits") and len(comparison.missed) == 5
    )
    assert comparison.warnings == []


def test_the_code_edit_median_goal_is_met_when_both_edits_are_well_ahead() -> None:
    ours = _localspec_json(edit2={"none": _row(20.2), "auto": _row(42.0)})
    comparison = bench_report.compare(ours, _server_json())
    assert comparison.kinds["code_edit"]["auto_vs_best_spec"] == pytest.approx(1.2)
    assert not any(m.startswith("code_edit") for m in comparison.missed)


def test_missing_runs_give_no_ratio_rather_than_a_failure() -> None:
    ours = _localspec_json(chat1={"none": _row(19.0)})
    (chat1,) = [p for p in bench_report.compare(ours, _server_json()).prompts if p.name == "chat1"]
    assert chat1.ratios["auto_vs_none"] is None and chat1.ratios["auto_vs_best_spec"] is None
    assert chat1.ratios["none_vs_plain"] == 0.95


def test_mismatched_runs_are_warned_about() -> None:
    ours, theirs = _localspec_json(), _server_json()
    ours["settings"] |= {"max_tokens": 128, "started": "2026-11-23T12:00:00+0000"}
    del theirs["prompts"]["chat1"]
    warnings = bench_report.compare(ours, theirs).warnings
    assert "only in localspec's file, left out: chat1" in warnings
    assert "max_tokens differs: localspec 128, llama-server 256" in warnings
    assert "the runs are 100 minutes apart: not the same window" in warnings


def test_the_printed_report_marks_every_miss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = bench_report.format_report(bench_report.compare(_localspec_json(), _server_json()))
    (chat_line,) = [line for line in lines if line.startswith("chat1")]
    assert chat_line.count("!") == 4
    (edit_line,) = [line for line in lines if line.startswith("edit1")]
    assert "!" not in edit_line and "ngram-mod" in edit_line
    assert "5 goal(s) missed:" in lines and sum(line.startswith("  MISSED") for line in lines) == 5
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    ours.write_text(json.dumps(_localspec_json()))
    theirs.write_text(json.dumps(_server_json()))
    out = tmp_path / "cmp.json"
    for extra, code in (([], None), (["--strict"], 1)):
        argv = ["bench_report.py", str(ours), str(theirs), "--json", str(out), *extra]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", argv)
            if code is None:
                bench_report.main()
            else:
                with pytest.raises(SystemExit) as exit_:
                    bench_report.main()
                assert exit_.value.code == code
    assert "MISSED chat1" in capsys.readouterr().out
    assert len(json.loads(out.read_text())["missed"]) == 5


def test_a_file_of_the_wrong_shape_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a": {"none": {}}}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["bench_report.py", str(bad), str(bad)])
        with pytest.raises(SystemExit) as exit_:
            bench_report.main()
    assert str(exit_.value.code).startswith("cannot compare")
