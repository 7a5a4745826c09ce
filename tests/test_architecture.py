"""Architecture rules of the project's own packages, checked from the source (ast, nothing imported):

- no import cycle between modules, counting every import in a module: at the top, inside functions (the lazy
  imports that keep `ragledger --help` fast) and under TYPE_CHECKING, relative imports resolved;
- no function (or method, or nested function) longer than MAX_FUNCTION_LINES lines;
- each package is one layer (LAYERS, bottom first) and imports only itself and the packages below it; inside
  tracking, the same for its parts (TRACKING_PARTS).

A failure names the cycle's modules or the function's file:name. Known offenders are listed below and only they
are tolerated; an entry that no longer offends fails too, so the lists only shrink."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "engines", "flows", "ragledger", "schemas", "strategies", "tasks", "tracking")
MAX_FUNCTION_LINES = 60

# Known offenders: an entry must be deleted once it no longer offends (the tests below say when), so these only
# shrink. Empty: there is no cycle and no function over the limit.
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_LONG_FUNCTIONS: set[str] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(f, root): f for pkg in packages for f in sorted((root / pkg).rglob("*.py"))}


def _imported(node: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement refers to (a `from X import y` may name module X.y)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            base = package[: len(package) - (node.level - 1)]
            module = ".".join([*base, node.module] if node.module else base)
        else:
            module = node.module or ""
        yield module
        yield from (f"{module}.{a.name}" for a in node.names)


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its source."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _imported(node, name, path.name == "__init__.py"):
                while target and target not in mods:  # `from pkg.mod import func` -> pkg.mod
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def long_functions(mods: dict[str, Path], root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """'file:function' -> its length in lines (def line to last line, decorators excluded), for those over limit."""
    out = {}
    for path in mods.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return out


def _show(cycle: frozenset[str]) -> str:
    return " <-> ".join(sorted(cycle))


def test_no_new_import_cycle():
    found = cycles(import_graph(modules()))
    new = [_show(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycle(s): {'; '.join(new)} (move the shared code to the lower module)"
    gone = [_show(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"cycle(s) no longer present: remove {'; '.join(gone)} from KNOWN_CYCLES in {Path(__file__).name}"


def test_no_new_long_function():
    found = long_functions(modules())
    new = {k: v for k, v in found.items() if k not in KNOWN_LONG_FUNCTIONS}
    assert not new, "function(s) over {} lines: {}".format(
        MAX_FUNCTION_LINES, ", ".join(f"{k} ({v} lines)" for k, v in sorted(new.items())))
    gone = sorted(KNOWN_LONG_FUNCTIONS - set(found))
    assert not gone, f"no longer over {MAX_FUNCTION_LINES} lines: remove {', '.join(gone)} from KNOWN_LONG_FUNCTIONS"


def test_the_checks_see_lazy_relative_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .. import c\n")  # pkg.sub -> pkg.c
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n    return g\n")  # lazy import
    (pkg / "b.py").write_text("from . import a\n")  # relative import: pkg.b -> pkg.a
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import x\n")
    (pkg / "d.py").write_text("def long():\n" + "    x = 1\n" * 80 + "\n\ndef short():\n    return 1\n")
    mods = modules(tmp_path, ("pkg",))
    graph = import_graph(mods)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg", "pkg.a"} and graph["pkg.sub"] == {"pkg", "pkg.c"}
    assert sorted(map(_show, cycles(graph))) == ["pkg.a <-> pkg.b", "pkg.c <-> pkg.sub"]
    assert long_functions(mods, tmp_path) == {"pkg/d.py:long": 81}


# The layers, bottom first: each is a package (a folder), and a module may import its own package and the
# packages below it, never one above. Inside tracking the same holds for its parts (store, analysis, report, mlflow):
# report, which shows analyses to people, reads analysis and store; analysis never knows how it is shown.
LAYERS: list[str] = ["core", "engines", "strategies", "schemas", "tracking", "tasks", "flows", "ragledger"]
TRACKING_PARTS: list[str] = ["store", "analysis", "report", "mlflow"]


def layer_of(module: str) -> tuple[int, int]:
    """(the package's place in LAYERS, the tracking part's place in TRACKING_PARTS or -1)."""
    parts = module.split(".")
    assert parts[0] in LAYERS, f"{module}: its package is not in LAYERS in {Path(__file__).name}; place it"
    part = TRACKING_PARTS.index(parts[1]) if parts[0] == "tracking" and len(parts) > 1 and parts[1] in TRACKING_PARTS else -1
    return LAYERS.index(parts[0]), part


def _above(target: tuple[int, int], source: tuple[int, int]) -> bool:
    return target[0] > source[0] or (target[0] == source[0] and target[1] > source[1] >= 0)


def _named(module: str) -> str:
    layer, part = layer_of(module)
    return LAYERS[layer] + (f".{TRACKING_PARTS[part]}" if part >= 0 else "")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({_named(m)}) imports {t} ({_named(t)})"
                  for m, targets in graph.items() for t in targets if _above(layer_of(t), layer_of(m)))


def test_every_package_is_a_layer():
    found = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests")
    assert found == sorted(LAYERS), f"packages {found}, layers {LAYERS}: place each package in LAYERS"
    assert sorted(PACKAGES) == sorted(LAYERS)
    modules_of_tracking = {m.split(".")[1] for m in modules() if m.startswith("tracking.")}
    assert modules_of_tracking == set(TRACKING_PARTS), f"tracking holds {sorted(modules_of_tracking)}: place each part"


def test_no_upward_import():
    found = upward_imports(import_graph(modules()))
    assert not found, "import(s) from a lower layer to a higher one: " + "; ".join(found)


def test_the_layer_check_sees_an_upward_import():
    graph = {"core.answers": {"tracking.store.events"}, "tracking.store.events": {"core.answers", "tracking.mlflow.log"},
             "tracking.mlflow.log": {"tracking.store.events"}}
    assert upward_imports(graph) == ["core.answers (core) imports tracking.store.events (tracking.store)",
                                     "tracking.store.events (tracking.store) imports tracking.mlflow.log (tracking.mlflow)"]


def test_an_analysis_never_imports_how_it_is_shown():
    graph = {"tracking.analysis.seed002": {"tracking.report.plots"},
             "tracking.report.report": {"tracking.analysis.registry", "tracking.store.ledger"}}
    assert upward_imports(graph) == ["tracking.analysis.seed002 (tracking.analysis) imports tracking.report.plots "
                                     "(tracking.report)"]
