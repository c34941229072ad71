"""The package's layers: every import points down (or within a layer), and no module imports itself
back through others. A module that needs something from a layer above it is in the wrong place."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_apc"

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS: list[set[str]] = [
    {"config", "arguments", "redaction", "workload"},  # what is asked for
    {"serving"},  # whatever serves a mode
    {"measure"},  # runs on a deployment, and what they measured
    {"verdicts"},  # pass or fail on measured runs
    {"results"},  # the results document
    {"gate"},  # a document judged against a baseline
    {"report"},  # renderers and the controller's report
    {"plugin", "__main__", "__init__"},  # the entry points
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
# At most this many modules beside the subpackages at the top (the entry points, settings, the command line,
# redaction).
TOP_LEVEL_MODULES = 6


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    """Whether ``node`` is an ``if TYPE_CHECKING:`` block (its imports exist for the type checker only)."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, in functions too; of an ``if TYPE_CHECKING:`` block only its
    ``else`` branch unless ``type_checking``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
        return
    if not type_checking and isinstance(node, ast.If) and _type_checking(node):
        children: Iterable[ast.AST] = node.orelse
    else:
        children = ast.iter_child_nodes(node)
    for child in children:
        yield from _import_nodes(child, type_checking)


def _imports(path: Path, name: str, known: set[str], type_checking: bool = True) -> set[str]:
    """The project modules ``path`` imports; type-only imports (``if TYPE_CHECKING:``) too when
    ``type_checking``: they are dependencies of the types, not of the running code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text()), type_checking):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("pytest_apc"))
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        if not base.startswith("pytest_apc"):
            continue
        for alias in node.names:
            full = f"{base}.{alias.name}"
            imported.add(full if full in known else base)
    imported.discard(name)
    return {m for m in imported if m in known and m != "pytest_apc"}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph(type_checking: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known, type_checking) for name, path in modules.items()}


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with subpackages and top-level modules as nodes (``config``, ``workload``, ``serving``...): a
    module of X importing one of Y is an edge X -> Y."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(_layer(module), set()).update(_layer(t) for t in targets)
    return {package: targets - {package} for package, targets in packages.items()}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle a depth-first walk of ``graph`` meets, as ``a -> b -> a``."""
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if target.startswith(node + "."):  # a package re-exporting its own modules
                continue
            if state.get(target) == 1:
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted(m for m in _modules() if _layer(m) not in RANK)
    assert not unplaced, f"modules in no layer (add them to LAYERS, in the right place): {unplaced}"


def test_imports_point_down() -> None:
    upward = [
        f"{module} ({_layer(module)}) imports {target} ({_layer(target)}), a layer above it"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if RANK[_layer(target)] > RANK[_layer(module)]
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    """No module imports itself back through others (imports for the type checker aside)."""
    cycles = _cycles(_graph(type_checking=False))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_import_cycles_between_packages() -> None:
    """No subpackage or top-level module imports itself back through others (``config -> workload ->
    config`` is a circle even when no single module is on one), imports for the type checker aside."""
    cycles = _cycles(_package_graph(_graph(type_checking=False)))
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_the_cycle_rules_themselves() -> None:
    """A circle through packages fails, though no module is on one; an import for the type checker does not
    count."""
    modules = {"pytest_apc.config": {"pytest_apc.workload.cases"}, "pytest_apc.workload.cases": set(),
               "pytest_apc.workload.plan": {"pytest_apc.config"}}  # fmt: skip
    assert not _cycles(modules)
    assert _cycles(_package_graph(modules)) == ["config -> workload -> config"]
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_apc.config import Settings\n"
        "else:\n    from pytest_apc.redaction import redact\n"
    )
    imported = {
        flag: {n.module for n in _import_nodes(ast.parse(source), flag) if isinstance(n, ast.ImportFrom)}
        for flag in (True, False)
    }
    assert imported == {
        True: {"typing", "pytest_apc.config", "pytest_apc.redaction"},
        False: {"typing", "pytest_apc.redaction"},
    }


def test_the_top_level_holds_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} modules at the top of pytest_apc/: {top}"


@pytest.mark.parametrize(
    ("module", "target", "allowed"),
    [
        ("pytest_apc.serving.server", "pytest_apc.workload.cases", True),
        ("pytest_apc.workload.cases", "pytest_apc.serving.server", False),
        ("pytest_apc.measure.session", "pytest_apc.results.document", False),
        ("pytest_apc.report.terminal", "pytest_apc.gate.compare", True),
    ],
)
def test_the_rule_itself(module: str, target: str, allowed: bool) -> None:
    """The rule this file enforces fails an import from above (so the tests above can fail)."""
    assert (RANK[_layer(target)] <= RANK[_layer(module)]) is allowed


# A module larger than this in code (function and method bodies; declaration tables do not count) holds
# more than one job: split it by responsibility.
MAX_BODY_LINES = 450


def body_lines(source: str) -> int:
    """Lines of function and method bodies in ``source`` (a nested function counts once, in its enclosing
    body; docstrings do not count)."""
    total = 0

    def walk(node: ast.AST) -> None:
        nonlocal total
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body
                if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                    body = body[1:]
                if body:
                    total += (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1
            elif isinstance(child, ast.ClassDef):
                walk(child)

    walk(ast.parse(source))
    return total


def test_no_module_is_too_large() -> None:
    sizes = {name: body_lines(path.read_text()) for name, path in _modules().items()}
    large = {name: n for name, n in sizes.items() if n > MAX_BODY_LINES}
    assert not large, f"modules over {MAX_BODY_LINES} lines of function bodies: {large}"


def test_body_lines_counts_bodies_only() -> None:
    source = (
        'X = {\n  "a": 1,\n}\n\ndef f():\n    """Doc."""\n    a = 1\n    return a\n\n'
        "class C:\n    def m(self):\n        return 1\n"
    )
    assert body_lines(source) == 3
