"""Build scripts/agent_set.json: the bench set's code edits as coding agents send them, lines numbered.

    .venv/bin/python scripts/make_agent_set.py            # rewrite scripts/agent_set.json
    .venv/bin/python scripts/make_agent_set.py --check    # exit 1 if the file differs from a rebuild

Agents show the model a file through a read tool that numbers its lines, and the model writes the
file back without the numbers. Each of bench_set.json's code edits (same files, same asks) becomes
one such prompt: the file's fenced block replaced by the tool's view of it, in the three forms agents
use, taken in turn: `cat -n` (OpenHands' viewer: the number, then a tab), Claude Code's Read (then
`→`) and SWE-agent's viewer (then `:`). Run like the bench set:

    .venv/bin/python scripts/head_to_head.py --server /tmp/llbuild/bin/llama-server \\
        --prompts scripts/agent_set.json --repeat 2
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH_SET = HERE / "bench_set.json"
OUT = HERE / "agent_set.json"
MARKS = (("cat -n", "\t"), ("Read", "→"), ("open", ":"))
FENCED = re.compile(r"\n\n```python\n(.*)\n```$", re.DOTALL)


def numbered(code: str, mark: str) -> str:
    """`code` as the tool shows it: each line's number right-aligned in six columns, then `mark`."""
    return "\n".join(f"{i:6d}{mark}{line}" for i, line in enumerate(code.split("\n"), 1))


def agent_prompt(entry: dict[str, Any], turn: int) -> dict[str, object]:
    """One code edit of the bench set as an agent sends it, its file shown by the `turn`th tool."""
    (message,) = entry["messages"]
    found = FENCED.search(message["content"])
    if found is None:
        raise SystemExit(f"{entry['name']}: no fenced file at the end of its prompt")
    tool, mark = MARKS[turn % len(MARKS)]
    ask = message["content"][: found.start()]
    named = re.search(r"[\w/.]+\.py", str(entry["source"]))
    path = named.group(0).rsplit("/", 1)[-1] if named else "the file"
    shown = f"{ask}\n\nThe `{tool}` tool showed {path}:\n{numbered(found.group(1), mark)}"
    return {
        "name": f"agent_{str(entry['name']).removeprefix('edit_')}",
        "kind": "agent_edit",
        "source": f"{entry['source']}; lines numbered as `{tool}` shows them",
        "messages": [{"role": "user", "content": shown}],
    }


def build() -> dict[str, object]:
    data = json.loads(BENCH_SET.read_text(encoding="utf-8"))
    edits = [p for p in data["prompts"] if p["kind"] == "code_edit"]
    return {
        "description": (
            "The bench set's code edits with their files shown numbered, as coding agents' read tools "
            "show them; built by scripts/make_agent_set.py from scripts/bench_set.json."
        ),
        "prompts": [agent_prompt(entry, turn) for turn, entry in enumerate(edits)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="Exit 1 if --out differs from a rebuild.")
    args = parser.parse_args()
    text = json.dumps(build(), indent=1, ensure_ascii=False) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a rebuild'}")
        sys.exit(0 if same else 1)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text)['prompts'])} prompts to {args.out}")


if __name__ == "__main__":
    main()
