"""Write the long-prompt set: four prompts of 6,000-14,000 tokens, as agents send them.

    .venv/bin/python scripts/make_long_set.py --out /tmp/long.json
    .venv/bin/python scripts/head_to_head.py --server /tmp/llbuild/bin/llama-server --ctx 16384 \\
        --prompts /tmp/long.json --repeat 1 --threads 2

The bench set's prompts stay under 1,100 tokens; an agent's context (its system prompt, tool output,
whole files) runs to 10,000 and more. Built from this Python's standard library (PSF-2.0): a class
renamed through configparser.py, a question over six pydoc reference topics, a summary of json's
decoder and encoder, and an agent's system prompt holding configparser.py with a task on shlex.py.
Token counts (Qwen2.5, CPython 3.11): 11,411, 6,077, 6,506 and 14,249; a 16,384-token context holds
each with a 128-token reply. docs/benchmarks.md, session 43.
"""

from __future__ import annotations

import argparse
import json
import pydoc_data.topics
import sys
import sysconfig
from pathlib import Path

TOPICS = ("class", "function", "exceptions", "with", "try", "raise")


def _lib(name: str) -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / name).read_text(encoding="utf-8")


def _entry(name: str, kind: str, source: str, *messages: tuple[str, str]) -> dict[str, object]:
    return {
        "name": name,
        "kind": kind,
        "source": f"CPython {sys.version.split()[0]} {source} (PSF-2.0)",
        "messages": [{"role": role, "content": text} for role, text in messages],
    }


def build() -> dict[str, object]:
    parser, shlex = _lib("configparser.py"), _lib("shlex.py")
    codecs = _lib("json/decoder.py") + "\n" + _lib("json/encoder.py")
    reference = "\n\n".join(pydoc_data.topics.topics[k] for k in TOPICS)
    fence = "```"
    return {
        "description": "Long prompts (6,000-14,000 tokens) built by scripts/make_long_set.py.",
        "prompts": [
            _entry(
                "long_edit_configparser",
                "code_edit",
                "Lib/configparser.py",
                (
                    "user",
                    "In this module, rename the class `RawConfigParser` to `PlainConfigParser` everywhere. "
                    f"Output the whole updated file in one {fence}python block, and nothing else.\n\n"
                    f"{fence}python\n{parser}{fence}",
                ),
            ),
            _entry(
                "long_qa_reference",
                "qa",
                "pydoc_data/topics.py",
                (
                    "user",
                    "Read this reference text, then answer: what happens to an exception raised inside a "
                    "`finally` clause while another exception is being handled? Answer in three "
                    f"sentences.\n\n{reference}",
                ),
            ),
            _entry(
                "long_summarize_json",
                "summarize",
                "Lib/json/decoder.py, Lib/json/encoder.py",
                (
                    "user",
                    "Summarize what these two modules do and how they fit together, in one paragraph."
                    f"\n\n{fence}python\n{codecs}{fence}",
                ),
            ),
            _entry(
                "long_agent_shlex",
                "code_edit",
                "Lib/shlex.py, with Lib/configparser.py as context",
                (
                    "system",
                    "You are a coding agent. The repository holds these files.\n\n"
                    f"configparser.py:\n{fence}python\n{parser}{fence}",
                ),
                (
                    "user",
                    "Add a docstring to every method of shlex.shlex that lacks one. Output the whole "
                    f"updated file in one {fence}python block.\n\n{fence}python\n{shlex}{fence}",
                ),
            ),
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote 4 prompts to {args.out}")


if __name__ == "__main__":
    main()
