"""The layers import only downwards, and no modules import each other in a cycle.

kernels -> workloads, peers -> capture -> artifacts -> analysis -> report -> views -> (the
facade, the CLI, widgets, plans). Capture writes artifacts and returns analysis results, so it
may import artifacts and analysis; analysis reads artifacts on any machine, so it imports
neither torch, kernels, workloads nor capture; report draws analysis results and is imported by
neither analysis nor capture, not even inside a function. Every import statement counts,
wherever it stands, because a lazy back-import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOUNDATION = {"workbench.errors", "workbench.presets"}
# layer -> the layers it may import (itself and the foundation always)
ALLOWED = {
    "kernels": set(),
    "workbench.artifacts": set(),
    "workbench.workloads": {"kernels"},
    "workbench.peers": {"kernels"},
    "workbench.analysis": {"workbench.artifacts"},
    "workbench.capture": {
        "kernels",
        "workbench.workloads",
        "workbench.peers",
        "workbench.artifacts",
        "workbench.analysis",
    },  # fmt: skip
    "workbench.report": {"workbench.artifacts", "workbench.analysis"},
    "workbench.views": {"workbench.artifacts", "workbench.analysis", "workbench.report"},
}
NO_TORCH = ("workbench.analysis", "workbench.artifacts", "workbench.report", "workbench.views")
TOP = "top"  # the facade, the CLI, widgets and the plan runner may import anything


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer a module belongs to; None for third-party modules."""
    if module in FOUNDATION or any(module.startswith(f + ".") for f in FOUNDATION):
        return "foundation"
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    if module == "workbench" or module.startswith("workbench."):
        return TOP
    return None


def imports_of(path: Path, module: str, root: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module level) of every import statement in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            # `from pkg import module` imports the module; `from module import name` the module
            found += [(node.lineno, t if _is_module(t, root) else base, id(node) in top_level)
                      for t in targets]  # fmt: skip
    return found


def _is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def source_files(root: Path) -> list[Path]:
    return sorted([*root.glob("workbench/**/*.py"), *root.glob("kernels/**/*.py")])


def violations(root: Path) -> list[str]:
    """Every import that points up or sideways across layers, and torch where it is banned."""
    found = []
    for path in source_files(root):
        module = module_name(path, root)
        mine = layer_of(module)
        for line, target, _ in imports_of(path, module, root):
            where = f"{path.relative_to(root)}:{line} imports {target}"
            if target.split(".")[0] in {"torch", "triton"} and module.startswith(NO_TORCH):
                found.append(f"{where}: {mine} must run without torch")
            theirs = layer_of(target)
            if theirs is None or mine == TOP or theirs in (mine, "foundation"):
                continue
            if mine == "foundation" or theirs not in ALLOWED.get(mine, set()):
                found.append(f"{where}: {mine} may not import {theirs}")
    return found


def cycles(root: Path) -> list[list[str]]:
    """Import cycles among module-level imports (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = {}
    for path in source_files(root):
        module = module_name(path, root)
        graph[module] = {t for _, t, top in imports_of(path, module, root) if top and layer_of(t)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_every_import_points_down_the_layers():
    assert violations(ROOT) == []


def test_no_module_level_import_cycles():
    assert cycles(ROOT) == []


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("workbench/analysis/planted.py", "def f():\n    from workbench.report import html\n"),
        ("workbench/capture/planted.py", "from workbench.views import profile\n"),
        ("workbench/analysis/planted.py", "import torch\n"),
        ("kernels/planted.py", "from workbench.capture import timing\n"),
    ],
)
def test_a_planted_back_import_is_caught(tmp_path, module, planted):
    for path in source_files(ROOT):
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())
    (tmp_path / module).write_text(planted)
    assert [v for v in violations(tmp_path) if "planted.py" in v]


def test_a_planted_cycle_is_caught(tmp_path):
    for name, other in (("one", "two"), ("two", "one")):
        path = tmp_path / "workbench" / "analysis" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"from workbench.analysis import {other}\n")
    (tmp_path / "workbench" / "__init__.py").write_text("")
    (tmp_path / "workbench" / "analysis" / "__init__.py").write_text("")
    assert ["workbench.analysis.one", "workbench.analysis.two"] in cycles(tmp_path)
