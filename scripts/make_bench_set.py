"""Build scripts/bench_set.json, the benchmark's prompts, from public files on this machine.

    .venv/bin/python scripts/make_bench_set.py            # rewrite scripts/bench_set.json
    .venv/bin/python scripts/make_bench_set.py --check    # exit 1 if the file differs from a rebuild

The prompts look like real use, in seven kinds: whole-file code edits of real source files
(rename, docstrings, type hints, a bug to fix, a missing body to write), code writing, summaries,
questions answered from a given document, translation, open chat and math. Sources: CPython's
standard library and its bundled reference text (pydoc_data/topics.py, PSF-2.0), pure-Python modules
of packages installed in the venv (their licences named per entry), and prompts written for this set.
Each entry names its source file, version, lines and licence.

Everything is deterministic: where a choice is made (which comparison becomes the bug, which body
goes missing) it is drawn from random.Random(SEED). The files read depend on the installed versions,
so the build refuses to run against other versions than those pinned in BUILT_WITH (--force to
rebuild from what is installed, and commit the result with the new pins).

Sizes: every prompt stays under ~1,100 tokens of the Qwen2.5 tokenizer (tests/test_bench_set.py
counts them on the real model), so prompt + 512 generated tokens fit in n_ctx 4096.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchset_sources import (
    BUILT_WITH,
    Entry,
    installed_versions,
)
from benchset_tasks import all_entries

SEED = 15
OUT = Path(__file__).resolve().parent / "bench_set.json"


def build() -> dict[str, object]:
    """The whole set as the JSON object written to bench_set.json."""
    entries: list[Entry] = all_entries(SEED)
    return {
        "description": (
            "localspec's benchmark prompts, built by scripts/make_bench_set.py from public files; "
            "each entry names its source and licence."
        ),
        "seed": SEED,
        "built_with": BUILT_WITH,
        "prompts": [e.to_json() for e in entries],
    }


def render(data: dict[str, object]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="Exit 1 if --out differs from a rebuild.")
    parser.add_argument(
        "--force", action="store_true", help="Build from the installed versions even if not the pinned ones."
    )
    args = parser.parse_args()
    installed = installed_versions()
    if installed != BUILT_WITH and not args.force:
        sys.exit(f"pinned {BUILT_WITH}, installed {installed}: rebuild with --force and update BUILT_WITH")
    text = render(build())
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a rebuild'}")
        sys.exit(0 if same else 1)
    args.out.write_text(text, encoding="utf-8")
    data = json.loads(text)
    print(f"wrote {len(data['prompts'])} prompts to {args.out}")


if __name__ == "__main__":
    main()
