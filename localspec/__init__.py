"""localspec: lossless speculative decoding on llama.cpp, as a library, a daemon and a chat TUI.

The few names a library user needs, loaded on first use so that `import localspec`
stays cheap (`scripts/fetch-models` imports `localspec.models.fetch` before the
virtual environment, and llama.cpp, exist):

    from localspec import Engine, EngineConfig, GenerationRequest
    with Engine(EngineConfig(target=Path("model.gguf"))) as engine:
        print(engine.generate(GenerationRequest(prompt="def fib(n):")).text)

`Client` talks to a running daemon (`localspec serve`) instead.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Engine": "localspec.engine.worker",
    "EngineConfig": "localspec.engine.config",
    "LoadOptions": "localspec.engine.config",
    "GenerationRequest": "localspec.types",
    "GenerationResult": "localspec.types",
    "ChatMessage": "localspec.types",
    "SamplingParams": "localspec.types",
    "SpecParams": "localspec.types",
    "Client": "localspec.client",
    "LocalspecError": "localspec.errors",
}

__all__ = [
    "ChatMessage",
    "Client",
    "Engine",
    "EngineConfig",
    "GenerationRequest",
    "GenerationResult",
    "LoadOptions",
    "LocalspecError",
    "SamplingParams",
    "SpecParams",
    "__version__",
]

if TYPE_CHECKING:
    from localspec.client import Client
    from localspec.engine.config import EngineConfig, LoadOptions
    from localspec.engine.worker import Engine
    from localspec.errors import LocalspecError
    from localspec.types import ChatMessage, GenerationRequest, GenerationResult, SamplingParams, SpecParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value
