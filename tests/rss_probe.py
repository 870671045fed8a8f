"""Load a target and a draft through localspec.backend in a fresh process and report resident memory.

Run as `python tests/rss_probe.py TARGET DRAFT N_CTX KV_TYPE K`; prints one JSON object:
RSS before loading, after loading, and after a short speculative generation (which
touches the compute buffers as serving does). A separate process keeps the numbers
free of whatever the test session mapped or freed before.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil

from localspec.engine.config import LoadOptions
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.llama import LlamaModel
from localspec.engine.speculative import FixedPolicy, Generation
from localspec.types import SamplingParams

PROMPT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n"


def main(target: Path, draft: Path, n_ctx: int, kv_type: str, k: int) -> dict[str, int]:
    proc = psutil.Process()
    before = proc.memory_info().rss
    options = LoadOptions(n_ctx=n_ctx, kv_type=kv_type, gpu_layers=0)
    t = LlamaModel(target, options)
    d = LlamaModel(draft, options)
    loaded = proc.memory_info().rss
    gen = Generation(
        t,
        t.tokenize(PROMPT),
        max_tokens=6,
        params=SamplingParams(),
        stop=(),
        policy=FixedPolicy(ModelDrafter(d), k),
        method="draft",
        k=k,
    )
    for _ in gen.run():
        pass
    used = proc.memory_info().rss
    return {"before": before, "loaded": loaded, "generated": used}


if __name__ == "__main__":
    target, draft, n_ctx, kv_type, k = sys.argv[1:6]
    print(json.dumps(main(Path(target), Path(draft), int(n_ctx), kv_type, int(k))))
