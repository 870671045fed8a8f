"""Which model files to load: from the settings, else the catalog's defaults in the models folder.

generate and bench load what the settings say (explicit and reproducible; a context of
AUTO_CTX_MIN unless given); serve and chat, given no draft, load what pick-draft's fast path
chooses for the target and say why, and given no context, as long a one as the models and this
machine's memory allow (pickdraft.context).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.rpc import parse_endpoints
from localspec.errors import LocalspecError, ModelFileError
from localspec.models.catalog import load_catalog
from localspec.paths import Paths
from localspec.pickdraft.context import AUTO_CTX_MIN
from localspec.settings import Settings

if TYPE_CHECKING:
    from localspec.pickdraft.devices import DeviceMemory
    from localspec.pickdraft.rank import Choice


def target_path(settings: Settings, paths: Paths) -> Path:
    """The target GGUF: --target / LOCALSPEC_TARGET / config.toml, else the catalog's default."""
    if settings.target is not None:
        return settings.target.expanduser()
    catalog = load_catalog()
    default = paths.models_dir / catalog.get(catalog.default_target).file
    if not default.is_file():
        raise ModelFileError(
            f"no target model given and the default ({default.name}) is not in {paths.models_dir}; "
            "pass --target FILE, or run scripts/fetch-models"
        )
    return default


def draft_path(settings: Settings, paths: Paths, target: Path) -> Path | None:
    """The draft GGUF: as configured, else the catalog's paired draft when it is on disk."""
    if settings.draft is not None:
        return settings.draft.expanduser()
    catalog = load_catalog()
    files = {name: model.file for name, model in catalog.models.items()}
    for target_name, draft_name in catalog.pairs:
        candidate = paths.models_dir / files[draft_name]
        if target.name == files[target_name] and candidate.is_file():
            return candidate
    return None


def engine_config(settings: Settings, paths: Paths | None = None) -> EngineConfig:
    """The EngineConfig generate and bench load with (and serve and chat, given a draft)."""
    paths = paths or Paths.from_env()
    target = target_path(settings, paths)
    return _config(settings, paths, target, draft_path(settings, paths, target))


def serve_config(
    settings: Settings,
    paths: Paths | None = None,
    *,
    vram: int | None = None,
    ram: int | None = None,
    memory: DeviceMemory | None = None,
) -> tuple[EngineConfig, str | None]:
    """The EngineConfig serve and chat load with, and one line on what pick-draft chose and why.

    Given a draft (flag, LOCALSPEC_DRAFT or config.toml), that draft and no line. Otherwise
    pick-draft's fast path for this machine (`vram`/`ram` override its memory figures) fills
    what the person left unset (`apply_choice`); where the pick itself fails, the catalog's
    pairing applies as before, and the line says why. Given no context, it is sized against
    `memory` (the pool's view: what a load may use once it makes room), else this machine's.
    """
    paths = paths or Paths.from_env()
    if settings.rpc:
        return _rpc_config(settings, paths)
    if "draft" in settings.model_fields_set:
        return _sized(engine_config(settings, paths), settings, vram, ram, memory), None
    target = target_path(settings, paths)
    try:
        picked, choice, saved = _picked(settings, target, vram=vram, ram=ram)
    except Exception as exc:  # the pick is advice: whatever breaks it, the daemon starts as it did before
        config = _sized(engine_config(settings, paths), settings, vram, ram, memory)
        why = exc.message if isinstance(exc, LocalspecError) else f"{type(exc).__name__}: {exc}"
        return config, f"{_loads(config)} — pick-draft failed ({why}); the catalog's pairing applies"
    config = _sized(_config(picked, paths, target, picked.draft), settings, vram, ram, memory)
    chose = choice.draft.name if choice.draft else choice.method
    expected = f"expected {choice.expected_speedup:.2f}x" + ("; saved for this machine" if saved else "")
    return config, f"{_loads(config)} — pick-draft chose {chose} ({expected}): {choice.reason}"


def _sized(
    config: EngineConfig, settings: Settings, vram: int | None, ram: int | None, memory: DeviceMemory | None
) -> EngineConfig:
    """`config` with the context `auto_context` gives its models on `memory` (else this machine's, with
    the overrides), where the settings give none. Headers only: nothing is loaded."""
    if settings.n_ctx is not None:
        return config
    from localspec.pickdraft.context import auto_context
    from localspec.pickdraft.devices import detect_memory
    from localspec.pickdraft.memplan import PLAN_K, ModelShape, draft_shape

    load = config.load
    try:
        target = ModelShape.from_file(config.target, config.cache_dir)
    except Exception:  # a file the load will refuse with its own words: at the context it always had
        return config
    n_ctx = auto_context(
        target,
        draft_shape(config.draft, config.cache_dir),
        memory if memory is not None else detect_memory(vram, ram),
        kv_type=load.kv_type,
        k=config.k or PLAN_K,
        repack=not load.batch_invariant,
        plain_prefill=load.plain_prefill,
        flash_attn=load.flash_attn,
    )
    return replace(config, load=replace(load, n_ctx=n_ctx))


def context_allowed(settings: Settings, config: EngineConfig) -> int | None:
    """The context `config`'s models would be sized at on this machine where the settings hold it
    lower (--ctx, LOCALSPEC_N_CTX or n_ctx in config.toml; an older `pick-draft --save` wrote 4,096
    there): serve says so at its start, as an agent's system prompt and tools alone can be past it.
    None where the settings give no context or not less."""
    if settings.n_ctx is None or settings.rpc:
        return None
    unset = settings.model_copy(update={"n_ctx": None})
    allowed = _sized(config, unset, None, None, None).load.n_ctx
    return allowed if allowed > settings.n_ctx else None


def serve_context(settings: Settings, target: Path, choice: Choice, device: DeviceMemory) -> int:
    """The context serve and chat load pick-draft's `choice` for `target` with on `device`: the settings'
    where they give one, else as long as the models and the memory allow (pickdraft.context)."""
    from localspec.pickdraft.rank import apply_choice

    picked = apply_choice(settings, choice)
    config = _config(picked, Paths.from_env(), target, picked.draft)
    return _sized(config, settings, None, None, device).load.n_ctx


def _rpc_config(settings: Settings, paths: Paths) -> tuple[EngineConfig, str]:
    """A target on RPC workers: pick-draft plans against this machine's memory, which the target does
    not use, so the draft is the configured or catalog one, and the line says how the workers split it."""
    from localspec.pickdraft.rpcplan import worker_line

    config = engine_config(settings, paths)
    load = config.load
    plan = worker_line(config.target, load.rpc, load.n_ctx, load.kv_type, config.cache_dir)
    return config, f"{_loads(config)} — {plan}; the draft runs here"


def model_serve_config(
    settings: Settings,
    target: Path,
    pin: str | None,
    paths: Paths | None = None,
    *,
    default: bool = False,
    memory: DeviceMemory | None = None,
) -> tuple[EngineConfig, str | None]:
    """What serve loads for one of the models it serves on demand, and one line on its draft.

    `pin` is the settings' draft for this model (a path, or "none" for no draft model); without
    one, pick-draft's fast path chooses for `target` on this machine. --draft/LOCALSPEC_DRAFT
    applies to the daemon's default model (`default`) only, before any pin: it was chosen for
    that target. `memory`: what its context is sized against (serve_config).
    """
    paths = paths or Paths.from_env()
    if default and ("draft" in settings.model_fields_set or settings.rpc):
        # --draft, LOCALSPEC_DRAFT or config.toml's draft; --rpc
        return serve_config(settings, paths, memory=memory)
    # RPC workers hold the daemon's default target only: a worker serves one client at a time.
    own = settings.model_copy(update={"target": target, "draft": None, "rpc": None})
    if pin is not None:
        draft = None if pin.strip().lower() == "none" else Path(pin).expanduser()
        config = _sized(_config(own, paths, target, draft), own, None, None, memory)
        return config, f"{_loads(config)} — pinned in the settings (drafts)"
    own.model_fields_set.discard("draft")
    return serve_config(own, paths, memory=memory)


def _picked(
    settings: Settings, target: Path, *, vram: int | None, ram: int | None
) -> tuple[Settings, Choice, bool]:
    """pick-draft's choice applied to `settings`, and whether it was saved earlier for this machine."""
    from localspec.pickdraft.machine import choose_for_machine, pick_for_machine
    from localspec.pickdraft.rank import apply_choice, choose

    draft_only = settings.method == "draft"
    if vram is None and ram is None:  # this machine as it is: its choice is saved per target
        choice, saved = choose_for_machine(
            target,
            n_ctx=settings.n_ctx or AUTO_CTX_MIN,
            kv_type=settings.kv_type,
            repack=not settings.exact,
            draft_only=draft_only,
        )
        return apply_choice(settings, choice), choice, saved
    result = pick_for_machine(
        target,
        n_ctx=settings.n_ctx or AUTO_CTX_MIN,
        kv_type=settings.kv_type,
        vram=vram,
        ram=ram,
        repack=not settings.exact,
    )
    choice = result.choice
    if draft_only and choice.method != "draft":
        # The person asked for a draft model: the fastest usable one, even where it is not expected to pay.
        drafts = [c for c in result.candidates if c.usable and c.method == "draft"]
        choice = choose(drafts) if drafts else choice
    return apply_choice(settings, choice), choice, False


def _loads(config: EngineConfig) -> str:
    return f"draft {config.draft.name if config.draft else 'none'}, method {config.method}"


def _config(settings: Settings, paths: Paths, target: Path, draft: Path | None) -> EngineConfig:
    return EngineConfig(
        target=target,
        draft=draft,
        method=settings.method,
        k=settings.k,
        load=LoadOptions(
            n_ctx=settings.n_ctx or AUTO_CTX_MIN,
            n_threads=settings.threads,
            gpu_layers=settings.gpu_layers,
            kv_type=settings.kv_type,
            batch_invariant=settings.exact,
            plain_prefill=settings.plain_prefill,
            flash_attn=settings.flash_attn,
            rpc=parse_endpoints(settings.rpc) if settings.rpc else (),
        ),
        draft_gpu_layers=settings.draft_gpu_layers,
        queue_size=settings.queue_size,
        ngram_memory_tokens=settings.ngram_memory,
        prompt_cache_bytes=prompt_cache_bytes(settings),
        cache_dir=paths.cache_dir,
        derived_dir=paths.derived_models_dir,
    )


def prompt_cache_bytes(settings: Settings) -> int:
    """Memory a loaded model may keep saved conversations' caches in: the setting, or
    promptcache.default_limit of this machine's memory; none by default for a target on RPC
    workers, whose cache each save and load would carry over the network."""
    from localspec.engine.promptcache import default_limit
    from localspec.pickdraft.devices import parse_size
    from localspec.process.memory import ram

    if settings.prompt_cache is not None:
        return parse_size(settings.prompt_cache)
    if settings.rpc:
        return 0
    return default_limit(ram().total)
