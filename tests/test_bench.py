"""run_bench on the tiny models (repeats take turns, the fastest run is kept) and the report's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.engine.bench import BenchRow, decode_tps, kind_medians, report_json, run_bench
from localspec.engine.benchset import BenchPrompt
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, GenerationResult, GenerationStats

TINY = LoadOptions(n_ctx=512, n_threads=1)


def test_repeats_alternate_methods_and_the_fastest_run_of_each_is_reported(
    tiny_target: Path, tiny_perfect_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []
    speeds: dict[str, list[float]] = {}
    with Engine(EngineConfig(target=tiny_target, draft=tiny_perfect_draft, load=TINY)) as engine:
        generate = engine.generate

        def recorded(request: GenerationRequest) -> GenerationResult:
            result = generate(request)
            speeds.setdefault(request.speculative.method, []).append(decode_tps(result.stats))
            return result

        monkeypatch.setattr(engine, "generate", recorded)
        report = run_bench(
            engine,
            {"a": "hello world"},
            ["draft"],
            max_tokens=16,
            repeat=3,
            on_run=lambda name, method: calls.append((name, method)),
        )
    # Taking turns: drift over the minute a prompt takes is shared by every method.
    assert calls == [("a", "none"), ("a", "draft")] * 3
    assert {m: len(s) for m, s in speeds.items()} == {"none": 3, "draft": 3}
    rows = report["a"]
    assert rows["none"].decode_tps == round(max(speeds["none"]), 2)
    assert rows["draft"].decode_tps == round(max(speeds["draft"]), 2)
    assert rows["draft"].speedup_vs_none == round(max(speeds["draft"]) / max(speeds["none"]), 3)
    assert rows["draft"].identical_to_none and rows["draft"].acceptance_rate == 1.0
    for method, row in rows.items():
        assert row.spread == round(1 - min(speeds[method]) / max(speeds[method]), 3)


def test_decode_speed_counts_the_tokens_after_the_first_over_the_time_after_it() -> None:
    assert decode_tps(GenerationStats(tokens=11, elapsed_s=2.0, ttft_s=0.5)) == 10 / 1.5
    assert decode_tps(GenerationStats(tokens=1, elapsed_s=2.0, ttft_s=0.5)) == 0.0
    assert decode_tps(GenerationStats(tokens=5, elapsed_s=0.5, ttft_s=0.5)) == 0.0


def _row(decode: float, e2e: float, ttft: float, speedup: float) -> BenchRow:
    return BenchRow(
        decode_tps=decode,
        e2e_tps=e2e,
        ttft_s=ttft,
        spread=0.0,
        speedup_vs_none=speedup,
        acceptance_rate=0.0,
        identical_to_none=True,
        tokens=10,
        drafted=0,
        accepted=0,
        mean_accepted_length=0.0,
        k=0,
        mean_k=0.0,
        redecided=0,
        exact=True,
        python_share=0.0,
        method_steps={},
        fallback_reason=None,
        text="",
    )


def test_medians_per_kind_and_over_all_prompts() -> None:
    prompts = [
        BenchPrompt.user("e1", "x", "code_edit"),
        BenchPrompt.user("e2", "x", "code_edit"),
        BenchPrompt.user("e3", "x", "code_edit"),
        BenchPrompt.user("c1", "x", "chat"),
    ]
    report = {
        "e1": {"none": _row(10, 8, 0.2, 1.0), "auto": _row(30, 20, 0.2, 3.0)},
        "e2": {"none": _row(20, 16, 0.4, 1.0), "auto": _row(30, 22, 0.5, 1.5)},
        "e3": {"none": _row(12, 9, 0.3, 1.0), "auto": _row(24, 18, 0.3, 2.0)},
        "c1": {"none": _row(10, 9, 0.1, 1.0), "auto": _row(9, 8, 0.1, 0.9)},
    }
    medians = kind_medians(prompts, report)
    assert list(medians) == ["code_edit", "chat", "all"]
    assert medians["code_edit"]["auto"] == {
        "prompts": 3,
        "decode_tps": 30,
        "e2e_tps": 20,
        "ttft_s": 0.3,
        "speedup_vs_none": 2.0,
    }
    assert medians["chat"]["auto"]["speedup_vs_none"] == 0.9
    # Over all four prompts: the median of an even count is the mean of the middle two.
    assert medians["all"]["auto"]["speedup_vs_none"] == 1.75
    assert medians["all"]["none"]["decode_tps"] == 11
    data = report_json(prompts, report, {"max_tokens": 16})
    assert data["settings"] == {"max_tokens": 16}
    assert data["kinds"] == medians
    prompts_json = data["prompts"]
    assert isinstance(prompts_json, dict)
    assert prompts_json["c1"]["kind"] == "chat" and prompts_json["c1"]["methods"]["auto"]["decode_tps"] == 9
