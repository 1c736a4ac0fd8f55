"""The architecture of launch/ holds: config and registry are leaves, and no import circle exists
between modules (imports anywhere in a module, deferred ones included; type-only imports under
TYPE_CHECKING excluded)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("launch", "model", "data")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at the top or deferred inside a function."""
    out: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    files = [f for pkg in PACKAGES for f in (REPO / pkg).rglob("*.py")]
    modules = {module_name(f): f for f in files}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports_of(path) if m in modules and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt] if nxt in stack else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*stack, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_find_cycle_detects_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_config_and_registry_are_leaves() -> None:
    graph = import_graph()
    leaves = ("launch.config", "launch.config.schema", "launch.config.loader", "launch.registry")
    for leaf in leaves:
        launch_deps = {m for m in graph[leaf] if m.startswith("launch.")}
        allowed = {m for m in launch_deps if m.startswith(("launch.config", "launch.errors"))}
        allowed |= {"launch.registry"} if leaf != "launch.registry" else set()
        assert launch_deps <= allowed, f"{leaf} imports components: {launch_deps - allowed}"
