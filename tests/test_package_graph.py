"""The package layout docs/design.md describes: no package imports one that imports it
back, the services know neither front door, and neither door imports the other."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "logmq"


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the files that import it (type-only imports too)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).parts
        package = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        edges = graph.setdefault(package, {})
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                bits = name.split(".")
                if bits[0] == "logmq" and len(bits) > 1 and bits[1] != package:
                    edges.setdefault(bits[1], []).append(str(path.relative_to(SRC)))
    return graph


def test_no_package_imports_one_that_imports_it_back():
    graph = package_graph()

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, {}):
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for p in graph if (c := cycle_from(p))]
    assert not cycles, cycles


def test_services_know_no_door_and_doors_not_each_other():
    graph = package_graph()
    for package, door in (("broker", "kafka"), ("broker", "native"), ("kafka", "native"),
                          ("native", "kafka"), ("broker", "server")):  # fmt: skip
        assert door not in graph.get(package, {}), (package, door, graph[package].get(door))


BROKER = SRC / "broker"
# broker/'s rooms, lowest first: a room may import the rooms below it, never one above;
# the modules beside them (config, metrics) are leaves every room may use
ROOMS = ["metadata", "replica", "coordinator"]


def broker_graph() -> dict[str, dict[str, list[str]]]:
    """Inside broker/: room or top-level module -> what it imports there -> the files."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in BROKER.rglob("*.py"):
        parts = path.relative_to(BROKER).parts
        unit = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        edges = graph.setdefault(unit, {})
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                bits = name.split(".")
                inside = bits[:2] == ["logmq", "broker"] and len(bits) > 2 and bits[2] != unit
                if inside and (bits[2] in ROOMS or (BROKER / f"{bits[2]}.py").exists()):
                    edges.setdefault(bits[2], []).append(str(path.relative_to(SRC)))
    return graph


def test_broker_is_three_rooms_and_the_modules_beside_them():
    units = {p.name for p in BROKER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert units == set(ROOMS)
    beside = {p.stem for p in BROKER.glob("*.py")} - {"__init__"}
    assert beside == {"config", "config_view", "metrics"}


def test_no_arrow_runs_back_up_inside_broker():
    graph = broker_graph()
    for room, edges in graph.items():
        for target, files in edges.items():
            if room in ROOMS and target in ROOMS:
                assert ROOMS.index(target) < ROOMS.index(room), (room, target, files)
            elif room not in ROOMS:  # a module beside the rooms uses none of them
                assert target not in ROOMS, (room, target, files)


def test_every_package_is_installed():
    """A package missing from pyproject.toml's list works in an editable checkout and is
    missing from the wheel."""
    import tomllib

    listed = set(tomllib.loads((SRC.parent.parent / "pyproject.toml").read_text())["tool"]
                 ["setuptools"]["packages"])  # fmt: skip
    found = {
        ".".join(("logmq", *p.parent.relative_to(SRC).parts)) for p in SRC.rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)
