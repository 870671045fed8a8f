"""Build scripts/agent_set.json and agent_json_set.json: the bench set's code edits as agents send them.

    .venv/bin/python scripts/make_agent_set.py            # rewrite both files
    .venv/bin/python scripts/make_agent_set.py --check    # exit 1 if either differs from a rebuild

Agents show the model a file through a read tool that numbers its lines, and the model writes the
file back without the numbers. Each of bench_set.json's code edits (same files, same asks) becomes
one such prompt: the file's fenced block replaced by the tool's view of it, in the three forms agents
use, taken in turn: `cat -n` (OpenHands' viewer: the number, then a tab), Claude Code's Read (then
`→`) and SWE-agent's viewer (then `:`). Run like the bench set:

    .venv/bin/python scripts/head_to_head.py --server /tmp/llbuild/bin/llama-server \\
        --prompts scripts/agent_set.json --repeat 2

agent_json_set.json has the same edits with the file in a tool's JSON result, its line breaks
escaped in a JSON string, as tools that answer in JSON return it, taken in turn: a `read_file` tool
(`{"path": ..., "content": ...}`) and a shell tool running `cat -n` (`{"exit_code": 0, "stdout":
...}`, the lines numbered inside the string). The model writes the file back plainly.
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
JSON_OUT = HERE / "agent_json_set.json"
MARKS = (("cat -n", "\t"), ("Read", "→"), ("open", ":"))
FENCED = re.compile(r"\n\n```python\n(.*)\n```$", re.DOTALL)


def numbered(code: str, mark: str) -> str:
    """`code` as the tool shows it: each line's number right-aligned in six columns, then `mark`."""
    return "\n".join(f"{i:6d}{mark}{line}" for i, line in enumerate(code.split("\n"), 1))


def _edit(entry: dict[str, Any]) -> tuple[str, str, str]:
    """A code edit's ask, its file's text and the file's name."""
    (message,) = entry["messages"]
    found = FENCED.search(message["content"])
    if found is None:
        raise SystemExit(f"{entry['name']}: no fenced file at the end of its prompt")
    named = re.search(r"[\w/.]+\.py", str(entry["source"]))
    path = named.group(0).rsplit("/", 1)[-1] if named else "the file"
    return message["content"][: found.start()], found.group(1), path


def agent_prompt(entry: dict[str, Any], turn: int) -> dict[str, object]:
    """One code edit of the bench set as an agent sends it, its file shown by the `turn`th tool."""
    ask, code, path = _edit(entry)
    tool, mark = MARKS[turn % len(MARKS)]
    shown = f"{ask}\n\nThe `{tool}` tool showed {path}:\n{numbered(code, mark)}"
    return _prompt(entry, "agent_", f"lines numbered as `{tool}` shows them", shown)


def json_prompt(entry: dict[str, Any], turn: int) -> dict[str, object]:
    """One code edit of the bench set with its file in a tool's JSON result, by the `turn`th tool."""
    ask, code, path = _edit(entry)
    result: dict[str, object]
    if turn % 2 == 0:
        tool, intro, result = "read_file", "The `read_file` tool returned", {"path": path, "content": code}
    else:
        tool, intro = "bash", f"The `bash` tool ran `cat -n {path}` and returned"
        result = {"exit_code": 0, "stdout": numbered(code, "\t")}
    shown = f"{ask}\n\n{intro}:\n{json.dumps(result, ensure_ascii=False)}"
    return _prompt(entry, "agent_json_", f"returned in a JSON string by `{tool}`", shown)


def _prompt(entry: dict[str, Any], prefix: str, how: str, shown: str) -> dict[str, object]:
    """The set's entry for a bench set's code edit, named with `prefix`, its file shown `how`."""
    return {
        "name": f"{prefix}{str(entry['name']).removeprefix('edit_')}",
        "kind": "agent_edit",
        "source": f"{entry['source']}; {how}",
        "messages": [{"role": "user", "content": shown}],
    }


def build() -> dict[str, object]:
    return {
        "description": (
            "The bench set's code edits with their files shown numbered, as coding agents' read tools "
            "show them; built by scripts/make_agent_set.py from scripts/bench_set.json."
        ),
        "prompts": [agent_prompt(entry, turn) for turn, entry in enumerate(_edits())],
    }


def build_json() -> dict[str, object]:
    return {
        "description": (
            "The bench set's code edits with their files in a tool's JSON result (line breaks escaped), "
            "as tools that answer in JSON return them; built by scripts/make_agent_set.py from "
            "scripts/bench_set.json."
        ),
        "prompts": [json_prompt(entry, turn) for turn, entry in enumerate(_edits())],
    }


def _edits() -> list[dict[str, Any]]:
    data = json.loads(BENCH_SET.read_text(encoding="utf-8"))
    return [p for p in data["prompts"] if p["kind"] == "code_edit"]


def render(data: dict[str, object]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 if either file differs from a rebuild.")
    args = parser.parse_args()
    stale = False
    for out, data in ((OUT, build()), (JSON_OUT, build_json())):
        text = render(data)
        if args.check:
            same = out.exists() and out.read_text(encoding="utf-8") == text
            print(f"{out}: {'up to date' if same else 'DIFFERS from a rebuild'}")
            stale = stale or not same
        else:
            out.write_text(text, encoding="utf-8")
            print(f"wrote {len(json.loads(text)['prompts'])} prompts to {out}")
    sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
