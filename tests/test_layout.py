"""The architecture of launch/ holds: config and registry are leaves, and no import circle exists
between modules. Every import counts: deferred ones inside functions and type-only ones under
TYPE_CHECKING (a type annotation is a dependency too; excluding them once hid the circle
trainer -> optim -> qk_clip -> trainer, which callbacks now break with the TrainerView protocol)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("launch", "model", "data")
DATA_PACKAGES = {"normlab.recipes": "recipes"}  # folders installed as package data (pyproject)


def module_name(path: Path) -> str:
    parts = ("normlab", *path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports: at the top, deferred inside a function, or for type checking."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_type_only_and_deferred_imports_are_edges(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from normlab.launch.training.trainer import Trainer\n"
        "def f():\n    import normlab.launch.optim\n"
    )
    (tmp_path / "m.py").write_text(source)
    assert {"normlab.launch.training.trainer", "normlab.launch.optim"} <= imports_of(
        tmp_path / "m.py"
    )


def test_callbacks_see_the_trainer_through_a_protocol() -> None:
    """Instruments and optimizer callbacks never import the Trainer class (only TrainerView)."""
    graph = import_graph()
    users = [
        m for m in graph if m.startswith(("normlab.launch.instruments", "normlab.launch.optim"))
    ]
    assert users
    for m in users:
        assert "normlab.launch.training.trainer" not in graph[m], m


def test_find_cycle_detects_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_config_and_registry_are_leaves() -> None:
    graph = import_graph()
    config, registry = "normlab.launch.config", "normlab.launch.registry"
    leaves = (config, *(f"{config}.{m}" for m in ("schema", "loader", "build", "checks")), registry)
    for leaf in leaves:
        launch_deps = {m for m in graph[leaf] if m.startswith("normlab.launch.")}
        allowed = {m for m in launch_deps if m.startswith((config, "normlab.launch.errors"))}
        allowed |= {registry} if leaf != registry else set()
        assert launch_deps <= allowed, f"{leaf} imports components: {launch_deps - allowed}"


def test_one_installed_namespace() -> None:
    """Every package folder is installed as `normlab.<folder>`, and nothing named `model`,
    `data` or `launch` is importable outside the repository (a user's model.py cannot shadow)."""
    import subprocess
    import sys
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {f.parent for pkg in PACKAGES for f in (REPO / pkg).rglob("__init__.py")}
    code = {module_name(f / "__init__.py") for f in folders}
    assert set(setup["packages"]) == code | set(DATA_PACKAGES)  # recipes/: data, no code
    assert setup["package-dir"] == {f"normlab.{p}": p for p in (*PACKAGES, *DATA_PACKAGES.values())}
    assert not any(any((REPO / d).rglob("*.py")) for d in DATA_PACKAGES.values())
    probe = f"import importlib.util as u; print([u.find_spec(n) is None for n in {PACKAGES!r}])"
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True)
    assert out.stdout.strip() == "[True, True, True]", out.stderr


# test files that check the repository as a whole, not one package
REPO_WIDE_TESTS = {
    "test_layout.py", "test_readme_commands.py", "test_science_doc.py",
    "test_docs_commands.py", "test_docs_site.py",  # the documentation site (docs/, mkdocs.yml)
}  # fmt: skip


def test_tests_mirror_the_package() -> None:
    """tests/<folder>/test_*.py tests the package folder of the same path (tests/launch/study ->
    launch/study); only the repository-wide checks sit at tests/ itself."""
    tests = REPO / "tests"
    at_root = {p.name for p in tests.glob("test_*.py")}
    assert at_root <= REPO_WIDE_TESTS, sorted(at_root - REPO_WIDE_TESTS)
    for test in tests.rglob("test_*.py"):
        folder = test.parent.relative_to(tests)
        if folder == Path("."):
            continue
        assert (REPO / folder).is_dir() and (REPO / folder / "__init__.py").is_file(), test
        assert (test.parent / "__init__.py").is_file(), f"{test.parent} needs an __init__.py"


def test_type_checker_debt_only_shrinks() -> None:
    """pyproject.toml's list of modules the type checker skips (.ci/typecheck) was 55 long when
    mypy came in; a module leaves it when clean, none joins (new code is checked from the start)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    overrides = [o for o in config.get("overrides", []) if o.get("ignore_errors")]
    skipped = [m for o in overrides for m in o["module"]]
    assert config["disallow_untyped_defs"] and config["check_untyped_defs"]
    assert len(skipped) <= 55, len(skipped)
    for module in skipped:
        path = REPO / module.removeprefix("normlab.").replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module


# --- the house: rooms and floors ------------------------------------------------------------------
# A room is what a picture of the package draws as one box: a top-level package (model/, data/),
# a folder of launch/ (launch/study/), or a module directly in launch/ (launch/slurm.py). Every
# import counts (module level, inside functions, under TYPE_CHECKING). On an acyclic room graph a
# floor is the longest chain of rooms below a room; an arrow back up is an import from a room to
# one on a higher floor, so it can only exist where rooms import each other in a circle.
MAX_ROOM_SHARE = 0.13  # of the package's lines (issue 48)


def room_of(module: str) -> str:
    parts = module.split(".")[1:]  # without 'normlab'
    if parts[0] != "launch" or len(parts) == 1:
        return parts[0]
    return "launch/" + parts[1] + ("/" if (REPO / "launch" / parts[1]).is_dir() else ".py")


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {room_of(m): set() for m in graph}
    for module, deps in graph.items():
        rooms[room_of(module)] |= {room_of(d) for d in deps} - {room_of(module)}
    return rooms


def floors(rooms: dict[str, set[str]]) -> dict[str, int]:
    """Floor 1: rooms that import no room; otherwise one above the highest room imported."""
    out: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in out:
            out[room] = 1 + max((floor(d) for d in rooms[room]), default=0)
        return out[room]

    for room in rooms:
        floor(room)
    return out


def test_rooms_import_no_circle_and_no_arrow_runs_back_up() -> None:
    rooms = room_graph(import_graph())
    circle = find_cycle(rooms)
    assert circle is None, "rooms in a circle: " + " -> ".join(circle or [])
    level = floors(rooms)
    back = [(a, b) for a, deps in rooms.items() for b in deps if level[b] >= level[a]]
    assert back == [], back


def test_no_room_holds_more_than_its_share_of_the_lines() -> None:
    lines: dict[str, int] = {}
    for path in (f for pkg in PACKAGES for f in (REPO / pkg).rglob("*.py")):
        room = room_of(module_name(path))
        lines[room] = lines.get(room, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    biggest = max(lines, key=lambda r: lines[r])
    assert lines[biggest] <= MAX_ROOM_SHARE * total, (biggest, lines[biggest], total)


def test_rooms_and_floors_are_measured_as_drawn() -> None:
    """The measure itself: a deferred import counts, a room circle is found, floors stack."""
    rooms = {"a/": {"b/"}, "b/": {"c.py"}, "c.py": set()}
    assert floors(rooms) == {"a/": 3, "b/": 2, "c.py": 1}
    assert find_cycle({**rooms, "c.py": {"a/"}}) is not None
    assert room_of("normlab.launch.study.report") == "launch/study/"
    assert room_of("normlab.launch.slurm") == "launch/slurm.py"
    assert room_of("normlab.model.kernels.functions") == "model"
