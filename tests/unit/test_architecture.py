"""The shape of the code, checked: dependencies point one way, the configuration is the ground floor, files stay small.

Imports are read from the source (every ``import`` statement, function-level ones included; ``if TYPE_CHECKING:``
blocks excluded, as they never run), so a cycle hidden inside a function is found too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("insitu", "tasks", "flows", "deployments")
MAX_LINES = 400
# Modules still over MAX_LINES, each to be split; the list only shrinks.
TOO_LONG_FOR_NOW: set[str] = set()


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project's modules that ``name`` (at ``path``) imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            submodules = {f"{base}.{a.name}" for a in node.names} & set(modules)  # `from pkg import module`
            found.update(submodules)
            # `from own_package import module` inside that package only loads the module: the package is
            # already being imported. Anything else from a package runs its __init__.
            if not (submodules and len(submodules) == len(node.names) and name.startswith(base + ".")):
                found.add(base)
        todo.extend(ast.iter_child_nodes(node))
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_the_project() -> None:
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n")
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    graph = {n: _imports(p, n, modules) for n, p in modules.items()}
    assert _cycles(graph) == [["a", "b"]]


def test_dependencies_point_one_way() -> None:
    """flows → tasks → insitu; the core never imports the Prefect layer or the operator's code."""
    modules = _modules()
    layer = {"insitu": 0, "tasks": 1, "flows": 2, "deployments": 3}
    wrong = []
    for name, path in modules.items():
        for dep in _imports(path, name, modules):
            if layer[dep.split(".")[0]] > layer[name.split(".")[0]] and not name.startswith("deployments"):
                wrong.append(f"{name} -> {dep}")
    assert wrong == []


def test_the_configuration_is_the_ground_floor() -> None:
    """``insitu.conf`` imports nothing else of insitu, in the source and in a fresh interpreter (no torch either)."""
    modules = _modules()
    outside = {f"{n} -> {d}" for n, p in modules.items() if n.startswith("insitu.conf")
               for d in _imports(p, n, modules) if not d.startswith("insitu.conf") and d != "insitu"}
    assert outside == set()
    code = ("import sys, insitu.conf as c; c.load_conf('fraud', directory=sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m == 'prefect' or "
            "(m.startswith('insitu') and not m.startswith('insitu.conf') and m != 'insitu')))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "conf")], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_no_module_is_longer_than_it_can_be_read() -> None:
    too_long = {n for n, p in _modules().items()
                if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    assert too_long <= TOO_LONG_FOR_NOW, f"over {MAX_LINES} lines: {sorted(too_long - TOO_LONG_FOR_NOW)}"


def test_every_list_of_site_flows_names_the_deployed_ones() -> None:
    """The alerts and the cancelling of a lost run's site runs must know every site flow ``insitu deploy`` makes."""
    import deployments.alerts as alerts
    import tasks.job_lease as job_lease
    from deployments.worker_policy import SITE_FLOWS

    assert list(alerts.SITE_FLOWS) == job_lease.SITE_FLOWS == list(SITE_FLOWS)
