"""The CPU's extra weight buffers: AMX is never chosen (it crashes llama.cpp on some Intel CPUs).

Each test runs in a child interpreter: dropping a buffer type changes llama.cpp's state for the
rest of the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import llama_cpp
import pytest

HAS_AMX = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def _child(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_dropping_a_buffer_type_leaves_the_others_and_models_still_load(tiny_target: Path) -> None:
    got = _child(
        f"""
        import json
        from pathlib import Path
        from localspec.engine import ggml_backend
        from localspec.engine.llama import LlamaModel
        before = ggml_backend.extra_buffer_types()
        dropped = ggml_backend.drop_extra_buffer_types(before[:1])
        after = ggml_backend.extra_buffer_types()
        again = ggml_backend.drop_extra_buffer_types(before[:1])
        model = LlamaModel(Path({str(tiny_target)!r}))
        model.decode(model.tokenize("hello world"))
        print(json.dumps({{"before": before, "dropped": dropped, "after": after, "again": again,
                          "row": len(model.logits(-1)), "vocab": model.n_vocab}}))
        """
    )
    before = got["before"]
    assert isinstance(before, list)
    if not before:
        pytest.skip("this llama.cpp build has no extra CPU buffer types")
    assert got["dropped"] == before[:1]
    assert got["after"] == before[1:]
    assert got["again"] == []
    assert got["row"] == got["vocab"]


def test_models_never_load_into_amx_buffers(tiny_target: Path) -> None:
    got = _child(
        f"""
        import json
        from pathlib import Path
        from localspec.engine import ggml_backend
        from localspec.engine.llama import LlamaModel
        LlamaModel(Path({str(tiny_target)!r}))
        print(json.dumps({{"left": ggml_backend.extra_buffer_types()}}))
        """
    )
    assert "AMX" not in got["left"]  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_AMX, reason="this CPU or build has no AMX")
def test_the_default_loading_decodes_on_an_amx_cpu(qwen_draft: Path) -> None:
    # Before AMX was dropped this child died of SIGSEGV in ggml_backend_amx_mul_mat at its first
    # decode (2-vCPU KVM Xeon with amx_int8, llama-cpp-python 0.3.36).
    got = _child(
        f"""
        import json
        from pathlib import Path
        from localspec.engine.llama import LlamaModel
        model = LlamaModel(Path({str(qwen_draft)!r}))
        model.decode(model.tokenize("def add(a, b):\\n    return a + b\\n"))
        model.decode([int(model.logits(-1).argmax())])
        print(json.dumps({{"repack": model.repack, "next": int(model.logits(-1).argmax())}}))
        """
    )
    assert got["repack"] is True
