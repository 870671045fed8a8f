"""The one typed settings object, built once at the edge and passed down.

Sources, strongest first: values given by the caller (CLI flags), environment
variables `LOCALSPEC_<FIELD>`, the TOML file `<config dir>/config.toml`
(`pick-draft --save` writes it), then the defaults below.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from localspec.atomicfile import write_text_atomic
from localspec.errors import ConfigError, LocalspecError
from localspec.paths import Paths
from localspec.types import Method

# How long a streamed reply's chunks may gather before they go out together (Handle.gather): at
# 40 ms a CPU-bound 1.5B at ~40 tok/s sends about every other token, its Python time per step
# falls 0.06 ms and its decode gains ~1% on 2 cores (docs/benchmarks.md, session 39), and text
# still arrives 25 times a second.
STREAM_INTERVAL_MS = 40


class Settings(BaseSettings):
    """Everything a person may set; each field is also `LOCALSPEC_<NAME>` and a key in config.toml."""

    model_config = SettingsConfigDict(env_prefix="LOCALSPEC_", extra="ignore", validate_default=True)

    target: Path | None = Field(None, description="Target GGUF; default: the catalog's default target.")
    draft: Path | None = Field(None, description="Draft GGUF; default: pick-draft's saved choice, if any.")
    method: Method = Field("auto", description="Speculation method: auto, none, draft, ngram, layerskip.")
    k: int | None = Field(None, ge=1, le=32, description="Most tokens drafted per step; default 4, auto 15.")
    n_ctx: int | None = Field(
        None,
        ge=64,
        description="Context size in tokens for target and draft; default: for serve and chat the "
        "models' training context where memory allows (pickdraft.context, at least 4096), 4096 for "
        "generate and bench.",
    )
    threads: int | None = Field(None, ge=1, description="CPU threads; default: physical cores.")
    gpu_layers: int | None = Field(None, ge=-1, description="Target layers on the GPU; default: plan.")
    draft_gpu_layers: int | None = Field(None, ge=-1, description="Draft layers on the GPU; default: plan.")
    kv_type: str = Field("f16", description="KV cache type: f16, q8_0 or q4_0.")
    exact: bool = Field(
        False,
        description="True (--exact): batch-invariant loading, greedy output bit-identical to the target "
        "alone, slower on the CPU. False (default, --fast): llama.cpp's own loading, the target's "
        "distribution, greedy output identical up to float rounding, as llama.cpp's speculation is.",
    )
    plain_prefill: bool | None = Field(
        None,
        description="Read long prompts with a second, plain (not repacked) copy of the target's weights "
        "and hand its KV cache over: unset, where measured faster on this CPU (1.6x on AVX-512, cached "
        "per machine and model); true or false to force it. Never with exact or layers on a GPU.",
    )
    flash_attn: bool | None = Field(
        None,
        description="Flash attention (fast loading): unset, off for the CPU alone with an f16 cache "
        "and a context of 8192 or more (plain attention measured faster on long prompts, slightly "
        "slower on short ones), llama.cpp's choice otherwise; true or false to force it. Exact "
        "loading always has it on.",
    )
    ngram_memory: int = Field(
        16384,
        ge=0,
        description="Tokens of earlier requests' prompts and replies each loaded model keeps (in memory "
        "only) for n-gram drafting across requests; 0 turns it off (benchmarks that repeat a prompt).",
    )
    prompt_cache: str | None = Field(
        None,
        description="Memory each loaded model may keep earlier conversations' caches in (e.g. 2G), so "
        "a conversation that comes back after another's request is not read again; default an eighth "
        "of the machine's memory, 4G at most; 0 keeps none.",
    )
    rpc: str | None = Field(
        None,
        description="RPC workers (`localspec rpc-worker`) that hold the target's layers, as "
        "HOST:PORT[,HOST:PORT]; the draft stays on this machine. Default: none (all local).",
    )
    socket: Path | None = Field(None, description="Unix socket path for serve; default: runtime dir.")
    tcp: str | None = Field(None, description="Also listen on HOST:PORT (loopback unless a token is set).")
    token: str | None = Field(None, description="Bearer token required on TCP (always for non-loopback).")
    queue_size: int = Field(16, ge=1, description="Requests that may wait for the engine before 503.")
    embed_model: Path | None = Field(
        None, description="An embedding GGUF for the embeddings routes (serve; loaded on first use)."
    )
    stream_interval_ms: int = Field(
        STREAM_INTERVAL_MS,
        ge=0,
        le=1000,
        description="Milliseconds a streamed reply's chunks may gather before they go out together (the "
        "first goes at once); 0 sends each as it is made. Fewer wake-ups leave a CPU-bound engine more time.",
    )
    header_timeout: float = Field(10.0, gt=0, description="Seconds a client may take to send a request head.")
    body_timeout: float = Field(30.0, gt=0, description="Seconds a client may take to send a request body.")
    max_connections: int | None = Field(
        None, ge=8, description="Open connections per listener; default: a quarter of the open-file limit."
    )
    keep_alive: str = Field(
        "5m",
        description="How long serve keeps a model loaded after its last request, as Ollama's keep_alive: "
        "a duration (30s, 5m, 1h), 0 to unload at once, -1 to keep it until the daemon stops.",
    )
    max_resident: str | None = Field(
        None,
        description="Most memory the loaded models may take together (e.g. 12G); default: the memory "
        "plan's budget for this machine (free RAM and GPU memory at start, reserves left aside).",
    )
    drafts: dict[str, str] = Field(
        default_factory=dict,
        description="Drafts pinned per model for serve: model name (or file name) = draft GGUF path, "
        'or "none" for no draft model; a model without a pin gets pick-draft\'s choice.',
    )

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, value: str) -> str:
        from localspec.keepalive import parse_keep_alive

        try:
            parse_keep_alive(value)
        except LocalspecError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("rpc")
    @classmethod
    def _rpc(cls, value: str | None) -> str | None:
        from localspec.engine.rpc import parse_endpoints

        if value is None or not value.strip():
            return None
        try:
            return ",".join(parse_endpoints(value))
        except LocalspecError as exc:
            raise ValueError(exc.message) from None

    @field_validator("max_resident", "prompt_cache")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        from localspec.pickdraft.devices import parse_size

        try:
            if value is not None:
                parse_size(value)
        except LocalspecError as exc:
            raise ValueError(exc.message) from None
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=Paths.from_env().config_file)
        unread = _UNREAD.get()
        if not unread:
            return (init_settings, env_settings, toml)
        return (init_settings, _Without(env_settings, unread), _Without(toml, unread))


# Fields the settings being built take at their defaults, whatever env and file say (see
# load_settings_reading): a source's dict would merge into a default given as an argument.
_UNREAD: ContextVar[frozenset[str]] = ContextVar("unread", default=frozenset())


class _Without(PydanticBaseSettingsSource):
    """A settings source with some fields left out."""

    def __init__(self, source: PydanticBaseSettingsSource, fields: frozenset[str]) -> None:
        super().__init__(source.settings_cls)
        self._source = source
        self._fields = fields

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        return {key: value for key, value in self._source().items() if key not in self._fields}


def load_settings(**overrides: Any) -> Settings:
    """Build the settings; `None` overrides mean "not given" and fall through to env/file/defaults."""
    return load_settings_reading(None, **overrides)


def load_settings_reading(reads: Collection[str] | None, **overrides: Any) -> Settings:
    """The settings for a command that uses only the fields `reads` names (None: all of them): a bad
    value in any other field is taken at its default, so `localspec stop` or `pick-draft --save`
    (which rewrites the choice's keys) still run beside a config.toml line another command refuses.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        try:
            return Settings(**given)
        except ValidationError as exc:
            bad = {str(error["loc"][0]) for error in exc.errors()}
            if reads is None or bad & {*reads, *given}:
                raise
            token = _UNREAD.set(frozenset(bad))
            try:
                return Settings(**given)
            finally:
                _UNREAD.reset(token)
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {_described(exc, given)}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid settings: {_config()} is not TOML ({exc}); fix that line") from None
    except ValueError as exc:  # raised by a settings source rather than a field's check
        raise ConfigError(f"invalid settings: {exc}; check LOCALSPEC_* and {_config()}") from None


def _described(exc: ValidationError, given: dict[str, Any]) -> str:
    """Each bad value as `key = value: what is wrong`, then where to fix it."""
    parts, fixes = [], []
    for error in exc.errors():
        field = str(error["loc"][0])
        value = error.get("input")
        shown = f" = {value!r}" if value is not None and not isinstance(value, dict) else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{'.'.join(str(part) for part in error['loc'])}{shown}: {message}")
        env = f"LOCALSPEC_{field.upper()}"
        if field in given:
            continue  # a flag's own check names it; a caller's value is the caller's to fix
        fix = f"change or unset {env}" if env in os.environ else f"fix or remove it in {_config()}"
        if fix not in fixes:
            fixes.append(fix)
    return "; ".join(parts + fixes)


def _config() -> Path:
    return Paths.from_env().config_file


def save_settings(values: dict[str, Any], paths: Paths | None = None) -> Path:
    """Merge `values` into config.toml (written atomically) and return its path.

    A None value removes the key, so a saved choice without a draft drops an older draft.
    """
    paths = paths or Paths.from_env()
    path = paths.config_file
    current: dict[str, Any] = {}
    if path.is_file():
        current = tomllib.loads(path.read_text(encoding="utf-8"))
    for key, value in values.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = str(value) if isinstance(value, Path) else value
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_text_atomic(path, "".join(f"{k} = {_toml_value(v)}\n" for k, v in sorted(current.items())))
    return path


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
