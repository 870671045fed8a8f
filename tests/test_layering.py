"""The package's shape holds: each folder imports only what its layer may, no module cycles, light packages.

The core (engine, auto, pickdraft, models) never imports an interface: click, the HTTP
framework or Textual. The client and the TUI never reach llama.cpp. The TUI's own list
of what it may import is in test_tui_units.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "localspec"
INTERFACES = ("click", "starlette", "uvicorn", "textual", "httpx", "localspec.cli", "localspec.server", "tui")
# What each folder must not import, directly or lazily inside a function.
FORBIDDEN = {
    "engine": (*INTERFACES, "localspec.client", "localspec.pickdraft"),
    "auto": (*INTERFACES, "localspec.client", "localspec.pickdraft"),
    "pickdraft": (*INTERFACES, "localspec.client"),
    "models": (*INTERFACES, "localspec.client", "localspec.engine", "localspec.auto", "localspec.pickdraft"),
    "client": (
        "llama_cpp",
        "localspec.engine",
        "localspec.auto",
        "localspec.pickdraft",
        "localspec.server",
        "localspec.cli",
        "textual",
        "tui",
    ),
    "process": ("llama_cpp", "localspec.engine", "localspec.server", "localspec.cli", "textual", "tui"),
    "server": ("click", "textual", "localspec.cli", "tui"),
    "cli": ("llama_cpp",),  # the CLI reaches llama.cpp only through the engine
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def imports(path: Path) -> Iterator[str]:
    """Every module `path` imports at run time (top level or inside functions), as dotted names."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = _type_checking_lines(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_each_folder_imports_only_its_layer(folder: str) -> None:
    files = sorted((PACKAGE / folder).rglob("*.py"))
    assert files, f"localspec/{folder}/ is missing"
    for path in files:
        for name in imports(path):
            for banned in FORBIDDEN[folder]:
                assert not (name == banned or name.startswith(banned + ".")), (
                    f"{path.relative_to(ROOT)} imports {name}"
                )


def test_no_module_imports_another_in_a_cycle() -> None:
    modules = _modules()
    graph = {
        name: sorted({dep for dep in imports(path) if dep in modules and dep != name})
        for name, path in modules.items()
        if path.name != "__init__.py"
    }
    done: set[str] = set()
    stack: list[str] = []

    def visit(name: str) -> None:
        if name in stack:
            cycle = [*stack[stack.index(name) :], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        stack.append(name)
        for dep in graph.get(name, []):
            visit(dep)
        stack.pop()
        done.add(name)

    for name in graph:
        visit(name)


LIGHT = [
    "localspec",
    "localspec.engine",
    "localspec.engine.config",
    "localspec.engine.drafters",
    "localspec.engine.drafters.base",
    "localspec.auto",
    "localspec.auto.costmodel",
    "localspec.pickdraft",
    "localspec.pickdraft.rank",
    "localspec.pickdraft.machine",
    "localspec.models",
    "localspec.models.gguf_info",
    "localspec.resolve",
    "localspec.server",
    "localspec.client",
    "localspec.cli",
]


def test_packages_and_configs_import_without_llama_cpp() -> None:
    # A fresh interpreter: this test process has long since loaded llama.cpp.
    code = (
        "import importlib, sys\n"
        f"for name in {LIGHT!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'llama_cpp' not in sys.modules, name\n"
        "import localspec\n"
        "assert localspec.EngineConfig.__name__ == 'EngineConfig' and 'llama_cpp' not in sys.modules\n"
        "assert localspec.Engine.__name__ == 'Engine' and 'llama_cpp' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_front_door_names_what_a_library_user_needs() -> None:
    import localspec

    for name in localspec.__all__:
        assert getattr(localspec, name) is not None
    with pytest.raises(AttributeError):
        _ = localspec.NoSuchName
