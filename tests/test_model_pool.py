"""The pieces of serving many models that need no daemon: keep_alive, names and aliases, the budget.

Names come from real GGUF headers written by tinymodels; the daemon behaviour
(loading, eviction, expiry) is tested over a socket in test_api_models.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodels

from localspec.errors import ConfigError, ModelNotFoundError, UserInputError
from localspec.keepalive import describe_keep_alive, parse_keep_alive
from localspec.models.discovery import FoundModel
from localspec.models.gguf_info import read_gguf_info
from localspec.pickdraft.devices import GIB, MIB, DeviceMemory, apple, cpu_only, nvidia
from localspec.pickdraft.memplan import HOST_RESERVE
from localspec.server.budget import Budget, Footprint, Room
from localspec.server.catalog import ModelCatalog, ServedModel, build_catalog
from localspec.settings import load_settings


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), (30, 30.0), ("45", 45.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("0s", 0.0)],
)
def test_keep_alive_as_ollama_reads_it(value: float | str, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", [-1, "-1", "-1m", -0.5])
def test_a_negative_keep_alive_keeps_the_model_until_the_daemon_stops(value: float | str) -> None:
    assert parse_keep_alive(value) is None


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", "m5", "1d"])
def test_a_keep_alive_that_is_no_duration_is_one_clear_error(value: str) -> None:
    with pytest.raises(UserInputError, match="duration like 5m"):
        parse_keep_alive(value)


def test_keep_alive_described_for_people() -> None:
    assert [describe_keep_alive(s) for s in (None, 0.0, 300.0, 7200.0, 45.0)] == [
        "until stopped",
        "unload when idle",
        "5m",
        "2h",
        "45s",
    ]


def test_settings_check_keep_alive_max_resident_and_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_DRAFTS", '{"qwen2.5-coder:1.5b": "none"}')
    settings = load_settings(keep_alive="10m", max_resident="12G")
    assert settings.drafts == {"qwen2.5-coder:1.5b": "none"}
    with pytest.raises(ConfigError, match="keep_alive"):
        load_settings(keep_alive="later")
    with pytest.raises(ConfigError, match="max_resident"):
        load_settings(max_resident="lots")


def _found(folder: Path, name: str, source: str = "models", **kw: str) -> FoundModel:
    path = tinymodels.write_tiny_model(folder / f"{name}.gguf", name=name, **kw)  # type: ignore[arg-type]
    display = name if source == "ollama" else f"{name}.gguf"
    return FoundModel(path, source, display, read_gguf_info(path))  # type: ignore[arg-type]


@pytest.fixture
def catalog(tmp_path: Path) -> ModelCatalog:
    default = _found(tmp_path, "main")
    coder = _found(tmp_path, "coder", basename="Tiny-Coder", size_label="3M")
    twin_a = _found(tmp_path, "twin-a", basename="Twin", size_label="3M")
    twin_b = _found(tmp_path, "twin-b", basename="Twin", size_label="3M")
    pulled = _found(tmp_path, "llama3.2:1b", source="ollama")
    served = ServedModel("main", default.path, default.info, "target")
    return ModelCatalog(served, lambda: [default, coder, twin_a, twin_b, pulled], alias="localspec")


def test_names_are_stable_and_aliases_unambiguous(catalog: ModelCatalog) -> None:
    models = catalog.models()
    assert [m.name for m in models] == ["main", "coder", "twin-a", "twin-b", "llama3.2:1b"]
    aliases = {m.name: m.aliases for m in models}
    assert aliases["coder"] == ("coder.gguf", "tiny-coder:3m")
    assert "twin:3m" not in aliases["twin-a"] + aliases["twin-b"]  # two models claim it: neither gets it


@pytest.mark.parametrize(
    ("asked", "served"),
    [
        ("main", "main"),
        ("localspec", "main"),
        ("main:latest", "main"),
        ("coder.gguf", "coder"),
        ("tiny-coder:3m", "coder"),
        ("Tiny_Coder:3m", "coder"),
        ("llama3.2:1b", "llama3.2:1b"),
    ],
)
def test_requests_reach_the_model_they_name(catalog: ModelCatalog, asked: str, served: str) -> None:
    assert catalog.resolve(asked).name == served


@pytest.mark.parametrize("asked", ["twin:3m", "../main", "/etc/passwd", "gpt-4", "main.gguf/.."])
def test_unknown_or_ambiguous_names_are_not_found(catalog: ModelCatalog, asked: str) -> None:
    with pytest.raises(ModelNotFoundError, match="GET /v1/models"):
        catalog.resolve(asked)


def test_the_default_model_is_listed_once_and_first(tmp_path: Path) -> None:
    default = _found(tmp_path, "main")
    served = ServedModel("main", default.path, default.info, "target")
    assert [m.name for m in build_catalog(served, [_found(tmp_path, "other"), default])] == ["main", "other"]


def test_the_budget_counts_the_sum_and_the_cap() -> None:
    budget = Budget.for_device(cpu_only(16 * GIB), cap=100 * MIB)
    used, new = Footprint(host=60 * MIB), Footprint(host=30 * MIB)
    assert budget.fits(used, new)
    assert not budget.fits(used, Footprint(host=50 * MIB))
    refused = budget.refuse("big", Footprint(host=200 * MIB)).message
    assert "big needs 200.0 MiB" in refused and "100.0 MiB (max_resident)" in refused
    gpu = Budget(gpu=8 * GIB, host=4 * GIB)
    assert gpu.fits(Footprint(gpu=6 * GIB), Footprint(gpu=1 * GIB, host=1 * GIB))
    assert not gpu.fits(Footprint(gpu=6 * GIB), Footprint(gpu=3 * GIB))
    unified = Budget(gpu=8 * GIB, host=10 * GIB, unified=True)
    assert not unified.fits(Footprint(gpu=6 * GIB), Footprint(gpu=1 * GIB, host=4 * GIB))


def test_a_load_sees_the_memory_free_now_plus_what_the_loaded_models_hold() -> None:
    held = Footprint(gpu=2 * GIB, host=1 * GIB)
    gpu = Room(lambda: nvidia(24 * GIB, 32 * GIB, vram_free=10 * GIB)).alone(held)
    assert (gpu.gpu_free, gpu.ram_available) == (12 * GIB, 33 * GIB)
    mac = Room(lambda: apple(32 * GIB, ram_available=20 * GIB)).alone(held)
    assert (mac.gpu_free, mac.ram_available) == (apple(32 * GIB).gpu_free, 23 * GIB)
    cpu = Room(lambda: cpu_only(16 * GIB, 5 * GIB), cap=100 * MIB)
    budget = cpu.budget(cpu.alone(held))
    assert budget.host == 5 * GIB + 1 * GIB - HOST_RESERVE and budget.cap == 100 * MIB


def test_a_footprint_counts_the_plain_prefill_copy_as_the_setting_says(tiny_target: Path) -> None:
    from localspec.engine.config import EngineConfig, LoadOptions
    from localspec.server.budget import footprint

    def host(**load: bool | None) -> int:
        config = EngineConfig(target=tiny_target, load=LoadOptions(n_ctx=2048, **load))  # type: ignore[arg-type]
        return footprint(config, cpu_only(64 * GIB)).host

    may, off, forced = host(plain_prefill=None), host(plain_prefill=False), host(plain_prefill=True)
    assert off < may == forced  # unset: counted wherever the engine may attach one
    # Loaded --exact (nothing repacked) no plain copy is ever attached, whatever the setting says.
    assert host(batch_invariant=True, plain_prefill=None) == host(batch_invariant=True, plain_prefill=False)


def test_saved_caches_count_toward_the_machine_but_not_max_resident() -> None:
    budget = Budget(gpu=0, host=4 * GIB, cap=3 * GIB)
    model, saved = Footprint(host=1 * GIB), Footprint(host=2560 * MIB)
    assert budget.fits(model, model, Footprint(host=2 * GIB))  # 2 GiB of models, 4 GiB in all
    assert not budget.fits(model, model, saved)  # the machine's 4 GiB would not hold the caches too
    assert not budget.fits(model, Footprint(host=2 * GIB + 1))  # max_resident: models alone


# --- saved caches make room before loaded models do ------------------------------------------

FREE = 40 * GIB  # the simulated machine's available memory with nothing loaded
MODEL = 1 * GIB  # what the first model's memory plan says it takes


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("beside", "caches_kept", "first_kept"),
    [(2.0, True, True), (0.5, False, True), (-1.0, False, False)],
    ids=["room-for-all", "room-once-caches-go", "no-room-beside-it"],  # the last: unloaded, caches and all
)
async def test_a_load_drops_saved_caches_before_it_unloads_a_model(
    tiny_target: Path, beside: float, caches_kept: bool, first_kept: bool
) -> None:
    """The machine's free memory is what the loaded models and their saved caches leave. The
    second model's plan leaves `beside` times the first's saved bytes to spare beside the first
    model: room for all, room once the caches go, or none even without them."""
    import asyncio

    from test_engine import TINY
    from test_promptcache import CONVERSATION, OTHER, ask

    from localspec.engine.config import EngineConfig
    from localspec.engine.worker import Engine
    from localspec.pickdraft.memplan import budgets
    from localspec.server.pool import Loadout, ModelPool

    info = read_gguf_info(tiny_target)
    first, second = (ServedModel(name, tiny_target, info, "models") for name in ("first", "second"))
    config = EngineConfig(target=tiny_target, load=TINY, ngram_memory_tokens=0, prompt_cache_bytes=64 * MIB)
    sizes = {"first": MODEL}

    def probe() -> DeviceMemory:
        return cpu_only(64 * GIB, FREE - (pool.used() + pool.saved()).total)

    def prepare(model: ServedModel, _device: DeviceMemory) -> Loadout:
        return Loadout(config, None, Footprint(host=sizes[model.name]))

    pool = ModelPool(prepare, Engine, Room(probe), lambda _model: None)
    try:
        loaded = await pool.acquire(first)
        await asyncio.to_thread(ask, loaded.engine, CONVERSATION)
        await asyncio.to_thread(ask, loaded.engine, OTHER)  # the conversation's cache is saved
        pool.release(loaded)
        held = loaded.engine.info.saved_prompt_bytes
        assert held > 0
        host = budgets(cpu_only(64 * GIB, FREE))[1]
        sizes["second"] = host - MODEL - int(held * beside)
        pool.release(await pool.acquire(second))
        assert ("first" in pool.resident) == first_kept
        assert pool.saved().host == (held if caches_kept else 0)
    finally:
        await asyncio.to_thread(pool.close)
