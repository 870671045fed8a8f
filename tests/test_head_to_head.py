"""head_to_head's report: best rounds, ratios paired round by round, and runs merged."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from localspec.engine.benchset import BenchPrompt
from localspec.errors import UserInputError
from localspec.types import ChatMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import head_to_head as h2h

CONTESTANTS = ("server-plain", "server-ngram-simple", "server-ngram-mod", "localspec-none", "localspec-auto")


def timed(tps: float, text: str = "same") -> h2h.Timed:
    return h2h.Timed(text=text, tokens=128, ttft_s=1.0, decode_tps=tps)


def one_run(speeds: dict[str, list[float]]) -> dict[str, dict[str, list[h2h.Timed]]]:
    return {"p": {c: [timed(x) for x in speeds[c]] for c in CONTESTANTS}}


def reply(finish: str, usage_tokens: int, stats: dict[str, Any] | None = None) -> httpx.Response:
    """Three one-token chunks streamed, as llama-server streams them (localspec's with `stats` on
    its finish chunk), then the usage."""
    events: list[dict[str, Any]] = [
        {"choices": [{"delta": {"content": c}, "finish_reason": None}]} for c in "abc"
    ]
    if stats is not None:  # localspec's token chunks carry their ids
        for i, event in enumerate(events):
            event["localspec"] = {"token_ids": [i], "from_draft": 0}
    last: dict[str, Any] = {"choices": [{"delta": {}, "finish_reason": finish}]}
    events.append({**last, "localspec": stats} if stats else last)
    events.append({"choices": [], "usage": {"completion_tokens": usage_tokens}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def streamed(finish: str, usage_tokens: int, stats: dict[str, Any] | None = None) -> httpx.Client:
    """A client whose server streams `reply`."""
    answer = reply(finish, usage_tokens, stats)
    return httpx.Client(base_url="http://server", transport=httpx.MockTransport(lambda _: answer))


def test_llama_servers_end_token_is_not_counted_as_a_streamed_token() -> None:
    # Three tokens streamed, the end-of-generation token counted in usage: three tokens, two gaps.
    server = h2h.Contestant("server-plain", streamed("stop", 4), {}, counts_end=True)
    assert server.ask({"messages": []}).tokens == 3
    # Cut at max_tokens there is no end token to take off.
    assert h2h.Contestant("server-plain", streamed("length", 3), {}, counts_end=True).ask({}).tokens == 3
    # localspec counts what it streamed.
    assert h2h.Contestant("localspec-none", streamed("stop", 3), {}).ask({}).tokens == 3


def test_localspec_s_steps_and_drafts_are_kept_beside_its_speed() -> None:
    # Its finish chunk's stats say how the reply was decoded (a run that drafted little and one
    # whose drafts cost more read alike by speed alone); llama-server's have none.
    stats: dict[str, float] = {"steps": 2, "drafted": 2, "accepted": 1, "tokens": 3}
    ours = h2h.Contestant("localspec-auto", streamed("stop", 3, stats), {}).ask({})
    assert (ours.steps, ours.drafted, ours.accepted) == (2, 2, 1)
    theirs = h2h.Contestant("server-plain", streamed("stop", 4), {}, counts_end=True).ask({})
    assert (theirs.steps, theirs.drafted, theirs.accepted) == (None, None, None)
    # Where its time went: the target's seconds after the first token (the prompt's read is in its
    # target time, and before its own first token), the draft model's, and Python's.
    stats |= {"target_s": 5.0, "draft_s": 0.5, "python_s": 0.25, "ttft_s": 2.0}
    ours = h2h.Contestant("localspec-auto", streamed("stop", 3, stats), {}).ask({})
    assert (ours.llama_s, ours.draft_s, ours.python_s) == (3.0, 0.5, 0.25)
    assert "target 1500 ms a step, draft model 0.50 s, Python 0.25 s" in h2h._steps(ours)
    assert (theirs.llama_s, theirs.draft_s, theirs.python_s) == (None, None, None)
    # Runs written before these were kept still load.
    older: dict[str, Any] = json.loads('{"text": "x", "tokens": 3, "ttft_s": 1.0, "decode_tps": 9.0}')
    assert h2h.Timed(**older).steps is None
    assert h2h.Timed(**older).llama_s is None


def test_paired_ratio_is_the_median_of_round_by_round_ratios() -> None:
    # The machine ran fast in round 1 and slow in round 2: best rounds compare auto's fast round
    # with none's fast round, pairs compare each round with its neighbour.
    auto = [timed(60.0), timed(33.0), timed(45.0)]
    none = [timed(50.0), timed(30.0), timed(40.0)]
    assert h2h.paired(auto, none) == pytest.approx(1.125)


def test_summary_counts_only_ngram_mods_first_round_and_keeps_the_rest() -> None:
    speeds = {
        "server-plain": [30.0, 32.0],
        "server-ngram-simple": [35.0, 34.0],
        "server-ngram-mod": [36.0, 90.0],  # its second round drafts the reply it wrote in the first
        "localspec-none": [31.0, 30.0],
        "localspec-auto": [40.0, 45.0],
    }
    kept, rest = h2h.split_rounds(one_run(speeds))
    row = h2h.summarize({"p": "code_edit"}, kept, rest)["p"]
    assert row["contestants"]["server-ngram-mod"]["decode_tps"] == 36.0
    assert [t["decode_tps"] for t in row["not_counted"]["server-ngram-mod"]] == [90.0]
    assert row["auto_vs_best_server"] == pytest.approx(45.0 / 36.0, abs=1e-3)
    assert row["auto_vs_none"] == pytest.approx(45.0 / 31.0, abs=1e-3)
    assert row["auto_vs_none_paired"] == pytest.approx((40 / 31 + 45 / 30) / 2, abs=1e-3)
    assert row["none_vs_server_plain_paired"] == pytest.approx((31 / 30 + 30 / 32) / 2, abs=1e-3)


def test_auto_is_compared_with_the_best_of_all_server_modes_and_of_its_speculative_ones() -> None:
    # Nothing copied: llama-server's plain mode read fastest, its n-gram modes drafted nothing.
    speeds = {
        "server-plain": [40.0],
        "server-ngram-simple": [35.0],
        "server-ngram-mod": [36.0],
        "localspec-none": [37.0],
        "localspec-auto": [38.0],
    }
    kept, rest = h2h.split_rounds(one_run(speeds))
    row = h2h.summarize({"p": "qa"}, kept, rest)["p"]
    assert row["auto_vs_best_server"] == pytest.approx(38.0 / 40.0, abs=1e-3)
    assert row["auto_vs_best_server_spec"] == pytest.approx(38.0 / 36.0, abs=1e-3)


def test_the_held_out_best_mode_is_picked_on_the_other_rounds() -> None:
    # ngram-mod drafts; plain does not, but one of its rounds ran in a fast minute of the machine.
    speeds = {
        "server-plain": [40.0, 55.0, 40.0],
        "server-ngram-simple": [30.0, 30.0, 30.0],
        "server-ngram-mod": [50.0, 52.0, 51.0],
        "localspec-none": [38.0, 38.0, 38.0],
        "localspec-auto": [54.0, 54.0, 54.0],
    }
    rounds = {c: [timed(v) for v in s] for c, s in speeds.items()}
    # The best of the best rounds is plain's lucky 55.
    assert h2h.summarize({"p": "qa"}, {"p": rounds})["p"]["auto_vs_best_server"] == pytest.approx(
        54 / 55, abs=1e-3
    )
    # Picked on the other two rounds, the best mode is ngram-mod in each (51.5, 50.5, 51 against
    # plain's 47.5, 40, 47.5): 54 / 50, 54 / 52, 54 / 51, whose median is 54 / 51.
    assert h2h.held_out_best(rounds) == pytest.approx(54 / 51)
    assert h2h.summarize({"p": "qa"}, {"p": rounds})["p"]["auto_vs_best_server_held_out"] == pytest.approx(
        54 / 51, abs=1e-3
    )
    assert h2h.held_out_best({c: s[:1] for c, s in rounds.items()}) is None  # one round: no other


def test_merge_joins_the_rounds_of_runs_in_order(tmp_path: Path) -> None:
    paths = []
    for i, base in enumerate((30.0, 40.0)):
        speeds = {c: [base + j, base + j + 1] for j, c in enumerate(CONTESTANTS)}
        kept, rest = h2h.split_rounds(one_run(speeds))
        paths.append(tmp_path / f"run{i}.json")
        h2h.report(h2h.summarize({"p": "qa"}, kept, rest), paths[-1], {})
    kinds, runs = h2h.merge(paths)
    assert kinds == {"p": "qa"}
    assert [t.decode_tps for t in runs["p"]["localspec-none"]] == [33.0, 34.0, 43.0, 44.0]
    # Each run started its own llama-server: each run's first ngram-mod round counts.
    assert [t.decode_tps for t in runs["p"]["server-ngram-mod"]] == [32.0, 42.0]
    # A merged report merged again keeps every run's first ngram-mod round.
    h2h.report(h2h.summarize(kinds, runs), tmp_path / "merged.json", {})
    _, again = h2h.merge([tmp_path / "merged.json"])
    assert [t.decode_tps for t in again["p"]["server-ngram-mod"]] == [32.0, 42.0]
    # A report written before rounds were split (every round, no not_counted): ngram-mod's first only.
    old = json.loads(paths[0].read_text())
    old["prompts"]["p"]["rounds"]["server-ngram-mod"].append(
        dict(old["prompts"]["p"]["rounds"]["server-plain"][0])
    )
    del old["prompts"]["p"]["not_counted"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    _, older = h2h.merge([tmp_path / "old.json"])
    assert [t.decode_tps for t in older["p"]["server-ngram-mod"]] == [32.0]


def test_merge_refuses_runs_of_different_prompts_in_one_line(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, name in ((a, "p"), (b, "q")):
        speeds = {c: [30.0] for c in CONTESTANTS}
        runs = {name: one_run(speeds)["p"]}
        kept, rest = h2h.split_rounds(runs)
        h2h.report(h2h.summarize({name: "qa"}, kept, rest), path, {})
    with pytest.raises(UserInputError, match="ran other prompts"):
        h2h.merge([a, b])
    (tmp_path / "bad.json").write_text(json.dumps({"nothing": 1}))
    with pytest.raises(UserInputError, match=r"cannot read .* as head_to_head JSON"):
        h2h.merge([tmp_path / "bad.json"])


def recording() -> tuple[httpx.Client, list[dict[str, Any]]]:
    """A server that records each request's JSON and streams one short reply."""
    seen: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return reply("stop", 4)

    return httpx.Client(base_url="http://server", transport=httpx.MockTransport(answer)), seen


def test_sampled_runs_send_one_distribution_to_both_servers() -> None:
    args = h2h.parse_args(["--merge", "x.json", "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9"])
    sampling = h2h.sampling_of(args)
    assert sampling == {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0}
    server_http, to_server = recording()
    ours_http, to_ours = recording()
    contestants = [
        h2h.Contestant(
            "server-plain", server_http, {"samplers": h2h.LOCALSPEC_SAMPLER_ORDER}, counts_end=True
        ),
        h2h.Contestant("localspec-none", ours_http, {"speculative": {"method": "none"}}),
    ]
    prompt = BenchPrompt("p", "chat", (ChatMessage("user", "hi"),))
    h2h.run(contestants, [prompt], 16, 1, sampling)
    for body in (*to_server, *to_ours):
        assert (body["temperature"], body["top_k"], body["top_p"], body["seed"]) == (0.8, 40, 0.9, 0)
    # llama.cpp's default chain applies the temperature last; localspec applies it first.
    assert to_server[0]["samplers"][0] == "temperature" and "samplers" not in to_ours[0]


def test_greedy_is_the_default() -> None:
    assert h2h.sampling_of(h2h.parse_args(["--merge", "x.json"])) == {}


def test_llama_server_can_be_started_with_huge_pages_as_localspec_starts_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0")
    assert h2h.server_env(False) is None  # this process's environment, unchanged
    env = h2h.server_env(True)
    assert env is not None and env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
