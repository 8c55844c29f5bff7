"""The package's layers: imports flow one way, and no module imports itself back through others.

Read from the source with `ast` (so imports inside functions and under TYPE_CHECKING count too): a module may
import from its own layer's folder, or from any layer below it, never from above. The three layers that run a
query's later stages side by side (the ledger, the engine, the release) may not import one another.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dpsql"

# Highest first. A name is a sub-package (folder) or a top-level module of dpsql.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "__main__"),  # the package's public face
    ("frontends",),  # cli, dbapi, explain: what analysts touch
    ("session",),  # the pipeline, in order
    ("store", "release", "engines"),  # independent of one another
    ("rewrite",),
    ("planning",),
    ("analysis",),
    ("policy",),
    ("sql",),
    ("dp",),  # pure mathematics: noise, mechanisms, fixed point, intervals
    ("errors",),
)
_RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _component(module: str) -> str:
    """The layer member a dotted module name belongs to: 'dpsql.dp.noise' -> 'dp', 'dpsql.session' -> 'session'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__" and len(parts) > 1 and parts[-2] != "dpsql":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path) -> set[str]:
    """The dpsql modules that `module` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    modules = _modules()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from dpsql.dp import noise` imports the module dpsql.dp.noise
                full = f"{base}.{alias.name}"
                names.add(full if full in modules else base)
    names = {"dpsql.__init__" if name == "dpsql" else name for name in names}
    return {name for name in names if name in modules and name != module}


MODULES = _modules()
EDGES = {module: _imports(module, path) for module, path in MODULES.items()}


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if _component(m).removesuffix(".py") not in _RANK)
    assert not unplaced, f"add these to LAYERS: {unplaced}"


def _violations(module: str, imported: set[str]) -> list[str]:
    here = _component(module)
    wrong = []
    for name in sorted(imported):
        there = _component(name)
        if _RANK[there] < _RANK[here] or (_RANK[there] == _RANK[here] and there != here):
            wrong.append(f"{name} ({there} is not below {here})")
    return wrong


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_flow_down(module: str) -> None:
    wrong = _violations(module, EDGES[module])
    assert not wrong, f"{module} imports upwards or sideways: {wrong}"


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in EDGES[module]:
            if state.get(imported) == 1:
                cycle = [*path[path.index(imported):], imported] if imported in path else [module, imported]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if imported not in state:
                visit(imported, [*path, imported])
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])


def test_the_check_sees_a_wrong_import(tmp_path: Path) -> None:
    """The checks of this file can fail: upward, sideways and package-face imports are all reported."""
    path = tmp_path / "noise.py"
    path.write_text("import dpsql\nfrom dpsql.dp import mechanisms\n\n\ndef f():\n"
                    "    from dpsql.session import PrivateSession\n    from dpsql.engines import duckdb_engine\n")
    imported = _imports("dpsql.dp.noise", path)
    assert imported == {"dpsql.__init__", "dpsql.dp.mechanisms", "dpsql.session", "dpsql.engines.duckdb_engine"}
    assert [w.split(" ")[0] for w in _violations("dpsql.dp.noise", imported)] == [
        "dpsql.__init__", "dpsql.engines.duckdb_engine", "dpsql.session"]
    assert _violations("dpsql.store.ledger", {"dpsql.release.cells"})  # a sideways import between peers
