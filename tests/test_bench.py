"""run_bench on the tiny models: repeats take turns between methods, and the fastest run is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.engine.bench import run_bench
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, GenerationResult

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
            speeds.setdefault(request.speculative.method, []).append(result.stats.tokens_per_second)
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
    assert rows["none"].tokens_per_second == round(max(speeds["none"]), 2)
    assert rows["draft"].tokens_per_second == round(max(speeds["draft"]), 2)
    assert rows["draft"].identical_to_none and rows["draft"].acceptance_rate == 1.0
    for method, row in rows.items():
        assert row.spread == round(1 - min(speeds[method]) / max(speeds[method]), 3)
