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
