"""What serve and chat load: pick-draft's choice when no draft is given, the given draft otherwise,
and the catalog's pairing (with the reason) when the pick fails. generate and bench keep the pairing.

Device memory is the one fake: `vram`/`ram` describe the machine planned for.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypedDict

import pytest
import tinymodels

from localspec.errors import ConfigError
from localspec.models.catalog import load_catalog
from localspec.pickdraft.devices import GIB, detect_memory
from localspec.resolve import engine_config, model_serve_config, serve_config
from localspec.server.daemon import DaemonConfig, daemon_config
from localspec.settings import load_settings


class Machine(TypedDict):
    vram: int
    ram: int


GPU: Machine = {"vram": 24 * GIB, "ram": 8 * GIB}
CPU: Machine = {"vram": 0, "ram": 8 * GIB}


@pytest.fixture
def models(isolated: Path) -> Path:
    """A models folder of this test's own (see conftest's `isolated`)."""
    return isolated


@pytest.fixture(scope="module")
def big_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target some 40 times the tiny model's size, with its vocabulary: the tiny model drafts for it."""
    path = tmp_path_factory.mktemp("big") / "big-target.gguf"
    return tinymodels.write_tiny_model(path, n_layers=8, n_embd=256, n_ff=1024, name="big")


@pytest.fixture
def catalog_pair(models: Path, tiny_target: Path, tiny_perfect_draft: Path) -> tuple[Path, Path]:
    """The tiny target and a draft with its weights, under the catalog's default pair's file names."""
    catalog = load_catalog()
    target_name, draft_name = next(pair for pair in catalog.pairs if pair[0] == catalog.default_target)
    target = models / catalog.get(target_name).file
    draft = models / catalog.get(draft_name).file
    shutil.copy(tiny_target, target)
    shutil.copy(tiny_perfect_draft, draft)
    return target, draft


def test_on_a_gpu_the_pick_loads_the_small_draft_and_auto_runs_it(
    models: Path, big_target: Path, tiny_target: Path, lean_gpu: None
) -> None:
    draft = shutil.copy(tiny_target, models / "small.gguf")
    config, pick = serve_config(load_settings(target=big_target), **GPU)
    assert config.draft == draft and config.method == "auto"
    assert (config.load.gpu_layers, config.draft_gpu_layers) == (-1, -1)
    assert config.k == load_settings().k  # the choice's k is the draft method's, not auto's cap
    assert pick is not None
    assert pick.startswith("draft small.gguf, method auto — pick-draft chose small.gguf (expected ")
    assert "costs 0.02 of a target token here" in pick  # the choice's own reason
    # What the person set wins.
    kept, _ = serve_config(load_settings(target=big_target, gpu_layers=3, method="ngram", k=2), **GPU)
    assert (kept.draft, kept.load.gpu_layers, kept.method, kept.k) == (draft, 3, "ngram", 2)


def test_on_a_cpu_the_pick_loads_no_draft_where_generate_loads_the_pair(
    catalog_pair: tuple[Path, Path],
) -> None:
    target, draft = catalog_pair
    settings = load_settings(target=target)
    assert engine_config(settings).draft == draft  # generate and bench: explicit, as before
    config, pick = serve_config(settings, **CPU)
    assert config.draft is None and config.method == "auto" and config.load.gpu_layers == 0
    # With repacked weights a 2-token verify costs 1.98 target tokens (our calibration's prior): a fixed
    # n-gram method does not pay on average either; auto still drafts the long matches that do.
    assert pick is not None and pick.startswith("draft none, method auto — pick-draft chose none (")
    # It says why the draft lost: a draft of the target's size costs a whole target token.
    assert f"the draft {draft.name} costs 1.00 of a target token" in pick
    assert "slower than plain decoding" in pick


def test_method_draft_without_a_draft_gets_the_best_usable_one(catalog_pair: tuple[Path, Path]) -> None:
    target, draft = catalog_pair
    config, pick = serve_config(load_settings(target=target, method="draft"), **CPU)
    assert (config.draft, config.method) == (draft, "draft")
    assert pick is not None and f"pick-draft chose {draft.name}" in pick


def test_a_given_draft_is_loaded_and_nothing_is_picked(
    models: Path, tiny_target: Path, tiny_useless_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, pick = serve_config(load_settings(target=tiny_target, draft=tiny_useless_draft), **GPU)
    assert (config.draft, config.method, pick) == (tiny_useless_draft, "auto", None)
    monkeypatch.setenv("LOCALSPEC_DRAFT", str(tiny_useless_draft))
    from_env, pick = serve_config(load_settings(target=tiny_target, method="none"), **GPU)
    assert (from_env.draft, from_env.method, pick) == (tiny_useless_draft, "none", None)


def test_when_the_pick_fails_the_catalog_pairing_applies_with_why(catalog_pair: tuple[Path, Path]) -> None:
    target, draft = catalog_pair
    target.write_bytes(b"not a gguf at all" * 64)  # unreadable: the pick cannot read its header
    config, pick = serve_config(load_settings(target=target), **CPU)
    assert config.draft == draft and config.method == "auto"
    assert pick is not None
    assert pick.startswith(f"draft {draft.name}, method auto — pick-draft failed (")
    assert pick.endswith("; the catalog's pairing applies")


def test_a_machine_too_small_for_the_target_falls_back_too(catalog_pair: tuple[Path, Path]) -> None:
    target, draft = catalog_pair
    config, pick = serve_config(load_settings(target=target), vram=0, ram=GIB)
    assert config.draft == draft
    assert pick is not None and "pick-draft failed (" in pick and "GiB of RAM" in pick


def test_the_daemon_config_carries_the_pick(
    models: Path, tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    picked = daemon_config(load_settings(target=tiny_target), max_body_bytes=1 << 20)
    assert picked.engine.draft is None
    assert picked.pick is not None and picked.pick.startswith("draft none, method ")  # this machine's pick
    assert "— pick-draft chose " in picked.pick
    given = daemon_config(load_settings(target=tiny_target, draft=tiny_perfect_draft), max_body_bytes=1 << 20)
    assert (given.engine.draft, given.pick) == (tiny_perfect_draft, None)


def test_the_ngram_memory_is_a_setting(
    tiny_target: Path, tiny_perfect_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = {"target": tiny_target, "draft": tiny_perfect_draft}
    assert engine_config(load_settings(**given)).ngram_memory_tokens == 16384
    monkeypatch.setenv("LOCALSPEC_NGRAM_MEMORY", "0")  # what benchmarks that repeat a prompt set
    assert engine_config(load_settings(**given)).ngram_memory_tokens == 0
    assert serve_config(load_settings(**given))[0].ngram_memory_tokens == 0


def test_the_stream_interval_is_a_setting(tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert daemon_config(load_settings(target=tiny_target), max_body_bytes=1 << 20).stream_interval_s == 0.04
    monkeypatch.setenv("LOCALSPEC_STREAM_INTERVAL_MS", "0")  # each chunk as it is made
    assert daemon_config(load_settings(target=tiny_target), max_body_bytes=1 << 20).stream_interval_s == 0
    monkeypatch.setenv("LOCALSPEC_STREAM_INTERVAL_MS", "-5")
    with pytest.raises(ConfigError, match="stream_interval_ms"):
        load_settings(target=tiny_target)


def test_the_plain_prefill_is_measured_unless_set(tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_config(load_settings(target=tiny_target)).load.plain_prefill is None
    monkeypatch.setenv("LOCALSPEC_PLAIN_PREFILL", "false")
    assert engine_config(load_settings(target=tiny_target)).load.plain_prefill is False


def test_serve_loads_the_targets_training_context_where_generate_loads_4096(
    models: Path, tmp_path: Path, tiny_perfect_draft: Path
) -> None:
    """Agents' prompts (Claude Code's ~20,000 tokens of system prompt and tools) need more than the
    4,096 tokens serve loaded by default; generate and bench keep 4,096, as the settings say."""
    target = tinymodels.write_tiny_model(tmp_path / "long.gguf", n_ctx=16384)
    settings = load_settings(target=target)
    assert engine_config(settings).load.n_ctx == 4096
    assert serve_config(settings, **CPU)[0].load.n_ctx == 16384
    assert daemon_config(settings, max_body_bytes=1 << 20).engine.load.n_ctx == 16384  # this machine
    # A draft trained for 2,048 tokens drafts worse past them; the target's context is served.
    drafted = load_settings(target=target, draft=tiny_perfect_draft)
    assert serve_config(drafted, **CPU)[0].load.n_ctx == 16384
    # A draft whose header cannot be read is refused by the engine, which serves the target alone:
    # the target's context, as the pool counts it (budget.footprint).
    broken = tmp_path / "broken-draft.gguf"
    broken.write_bytes(b"not a gguf at all" * 64)
    assert serve_config(load_settings(target=target, draft=broken), **CPU)[0].load.n_ctx == 16384
    # A context given is loaded as given, by every command.
    given = load_settings(target=target, n_ctx=2048)
    assert engine_config(given).load.n_ctx == serve_config(given, **CPU)[0].load.n_ctx == 2048


def test_a_model_trained_for_less_or_a_machine_too_small_loads_4096(
    models: Path, tiny_target: Path, catalog_pair: tuple[Path, Path]
) -> None:
    assert serve_config(load_settings(target=tiny_target), **CPU)[0].load.n_ctx == 4096  # trained for 2,048
    target, _ = catalog_pair
    config, pick = serve_config(load_settings(target=target), vram=0, ram=GIB)
    assert pick is not None and "pick-draft failed (" in pick and config.load.n_ctx == 4096


def test_each_served_model_is_sized_by_the_memory_its_load_may_use(tmp_path: Path) -> None:
    """The pool sizes a model against the memory a load may use once it makes room (Room.alone),
    not what is free beside the models loaded now; a model whose draft the settings pin is sized too."""
    target = tinymodels.write_tiny_model(tmp_path / "wide.gguf", n_layers=8, n_embd=256, n_ctx=131072)
    settings = load_settings(target=target)
    roomy, tight = detect_memory(0, 64 * GIB), detect_memory(0, 2 * GIB)
    for pin in (None, "none"):
        wide = model_serve_config(settings, target, pin, memory=roomy)[0].load.n_ctx
        narrow = model_serve_config(settings, target, pin, memory=tight)[0].load.n_ctx
        assert wide == 131072 and 4096 <= narrow < wide, (pin, wide, narrow)
    given = load_settings(target=target, n_ctx=2048)
    assert model_serve_config(given, target, "none", memory=roomy)[0].load.n_ctx == 2048


def test_a_context_given_below_what_the_model_could_hold_is_named(models: Path, tmp_path: Path) -> None:
    target = tinymodels.write_tiny_model(tmp_path / "long.gguf", n_ctx=16384)

    def config(n_ctx: int | None) -> DaemonConfig:
        return daemon_config(load_settings(target=target, n_ctx=n_ctx), max_body_bytes=1 << 20)

    assert config(None).context_allowed is None  # sized to the model: nothing to say
    assert (config(4096).engine.load.n_ctx, config(4096).context_allowed) == (4096, 16384)
    assert config(16384).context_allowed is None
