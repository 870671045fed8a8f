"""Public text on this machine for the bench set: files read, cited, cut and changed reproducibly.

Used by make_bench_set.py. Sources are CPython's standard library (PSF-2.0) and pure-Python modules
of packages installed beside it; each comes back with a citation naming version, path, lines and
licence.
"""

from __future__ import annotations

import ast
import importlib.metadata
import io
import platform
import random
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PACKAGES = ("click", "idna")
# The versions the committed bench_set.json was built from; a rebuild from others differs.
BUILT_WITH = {"python": "3.11.7", "click": "8.5.1", "idna": "3.20"}

# Characters, not tokens: ~3.3 characters a token for Python code in Qwen2.5's tokenizer, ~4.3 for
# English prose, so these keep a prompt under ~1,100 tokens (the tests count the real tokens).
CODE_BUDGET = 3100
PROSE_BUDGET = 3900

# An off-by-one: each comparison becomes its neighbour.
FLIPPED = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}


@dataclass(frozen=True)
class Text:
    """Some public text and where it came from."""

    body: str
    cite: str


@dataclass(frozen=True)
class Entry:
    """One prompt of the set."""

    name: str
    kind: str
    source: str
    user: str

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "messages": [{"role": "user", "content": self.user}],
        }


def installed_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    versions.update({p: importlib.metadata.version(p) for p in PACKAGES})
    return versions


def stdlib_file(rel: str) -> Text:
    path = STDLIB / rel
    return Text(path.read_text(encoding="utf-8"), f"CPython {platform.python_version()} Lib/{rel} (PSF-2.0)")


def package_file(dist: str, rel: str) -> Text:
    meta = importlib.metadata.metadata(dist)
    fields = meta.json
    licence = fields.get("license_expression") or fields.get("license") or "see its dist-info"
    path = Path(str(importlib.metadata.distribution(dist).locate_file(rel)))
    return Text(path.read_text(encoding="utf-8"), f"{dist} {meta['Version']} {rel} ({licence})")


def reference_topic(topic: str) -> Text:
    """A section of the Python Language Reference as shipped in pydoc_data/topics.py."""
    from pydoc_data.topics import topics

    return Text(
        topics[topic].strip(),
        f"Python {platform.python_version()} reference, topic {topic!r}, Lib/pydoc_data/topics.py (PSF-2.0)",
    )


def module_docstring(rel: str) -> Text:
    source = stdlib_file(rel)
    doc = ast.get_docstring(ast.parse(source.body), clean=True) or ""
    return Text(doc, f"docstring of {source.cite}")


def string_constant(text: Text, name: str) -> Text:
    """A module-level `name = "..."` string (read, not imported: importing may run code)."""
    for node in ast.parse(text.body).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Constant):
            continue
        named = any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        if named and isinstance(node.value.value, str):
            return Text(node.value.value, f"{name} in {text.cite}")
    raise ValueError(f"no string constant {name} in {text.cite}")


def head_statements(text: Text, budget: int = CODE_BUDGET) -> Text:
    """The longest run of whole statements from the top that fits in `budget` characters.

    Top-level statements, and where a class does not fit whole, its first whole methods.
    """
    lines = text.body.splitlines(keepends=True)
    fits = lambda node: len("".join(lines[: node.end_lineno or node.lineno])) <= budget  # noqa: E731
    end = 0
    for node in ast.parse(text.body).body:
        if not fits(node):
            if isinstance(node, ast.ClassDef):
                end = max([end, *[m.end_lineno or m.lineno for m in node.body if fits(m)]])
            break
        end = node.end_lineno or node.lineno
    if end == 0:
        raise ValueError(f"the first statement of {text.cite} is over {budget} characters")
    whole = end == len(lines) or not "".join(lines[end:]).strip()
    cite = text.cite if whole else f"{text.cite}, lines 1-{end}"
    return Text("".join(lines[:end]).rstrip() + "\n", cite)


def head_paragraphs(text: Text, budget: int = PROSE_BUDGET) -> Text:
    """The longest run of whole paragraphs from the top that fits in `budget` characters."""
    kept: list[str] = []
    for para in text.body.split("\n\n"):
        if len("\n\n".join([*kept, para])) > budget:
            break
        kept.append(para)
    if not kept:
        raise ValueError(f"the first paragraph of {text.cite} is over {budget} characters")
    whole = len(kept) == len(text.body.split("\n\n"))
    cite = text.cite if whole else f"{text.cite}, first {len(kept)} paragraphs"
    return Text("\n\n".join(kept).strip(), cite)


def signature_and_docstring(text: Text, function: str) -> Text:
    """`def ...:` and the docstring of a top-level function, without its body."""
    lines = text.body.splitlines(keepends=True)
    for node in ast.parse(text.body).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
                raise ValueError(f"{function} in {text.cite} has no docstring")
            stop = doc.end_lineno or doc.lineno
            return Text("".join(lines[node.lineno - 1 : stop]), f"{function} in {text.cite}")
    raise ValueError(f"no function {function} in {text.cite}")


def inject_off_by_one(text: Text, rng: random.Random) -> tuple[Text, str]:
    """One comparison inside a function turned into its neighbour (< to <=, ...), and that function's name."""
    functions = _functions(text.body)
    candidates = [
        tok
        for tok in tokenize.generate_tokens(io.StringIO(text.body).readline)
        if tok.type == tokenize.OP and tok.string in FLIPPED and _enclosing(functions, tok.start[0])
    ]
    tok = rng.choice(candidates)
    row, col = tok.start
    lines = text.body.splitlines(keepends=True)
    line = lines[row - 1]
    lines[row - 1] = line[:col] + FLIPPED[tok.string] + line[col + len(tok.string) :]
    changed = f"{text.cite}, with {tok.string!r} on line {row} changed to {FLIPPED[tok.string]!r}"
    return Text("".join(lines), changed), _enclosing(functions, row)


def blank_body(text: Text, rng: random.Random) -> tuple[Text, str]:
    """One function's body (after its docstring) replaced by a TODO, and that function's name."""
    lines = text.body.splitlines(keepends=True)
    choices = []
    for node in ast.walk(ast.parse(text.body)):
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if body and 4 <= (node.end_lineno or 0) - body[0].lineno + 1 <= 14:
                choices.append((node.name, body[0].lineno, node.end_lineno or 0))
    name, first, last = rng.choice(sorted(choices))
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    lines[first - 1 : last] = [f"{indent}...  # TODO: write this body\n"]
    cut = f"{text.cite}, with the body of {name} (lines {first}-{last}) removed"
    return Text("".join(lines), cut), name


def _functions(code: str) -> list[tuple[str, int, int]]:
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((node.name, node.lineno, node.end_lineno or node.lineno))
    return found


def _enclosing(functions: list[tuple[str, int, int]], row: int) -> str:
    """The innermost function holding line `row`, '' if none."""
    inside = [(first, name) for name, first, last in functions if first <= row <= last]
    return max(inside)[1] if inside else ""
