"""The shape of the exporter's source, kept: modules a reader takes in whole, functions that fit a
screen, one description per probe kind (kinds.KINDS) instead of branches on a kind's name, and
no import cycle, at module level or deferred into a function."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from pathprobe.kinds import KINDS
from pathprobe.probe_settings import Probes

SOURCE = Path(__file__).resolve().parents[1] / "src" / "pathprobe"
MOST_LINES, MOST_FUNCTION_LINES = 500, 60
# Modules over MOST_LINES, each with why it is not split yet.
LONG_MODULES: set[str] = set()
# Import cycles not parted yet, each with why.
KNOWN_CYCLES: set[frozenset[str]] = set()


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SOURCE.rglob("*.py")):
        yield path.relative_to(SOURCE).as_posix(), path


def module_name(relative: str) -> str:
    parts = ["pathprobe", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("relative, path", list(modules()), ids=[r for r, _ in modules()])
def test_a_module_stays_within_500_lines(relative: str, path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert relative in LONG_MODULES or lines <= MOST_LINES, f"{relative}: {lines} lines"


def test_no_function_is_over_60_lines() -> None:
    long = [
        f"{relative}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"  # type: ignore[operator]
        for relative, path in modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MOST_FUNCTION_LINES  # type: ignore[operator]
    ]
    assert not long


def test_no_code_branches_on_a_probe_kind_outside_the_kind_table() -> None:
    # A comparison with a kind's name is a second description of that kind: the table says it once.
    branches = []
    for relative, path in modules():
        if relative == "kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                names = [o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)]
                if any(name in KINDS for name in names):
                    branches.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert not branches


def test_every_kind_has_its_settings_in_the_config() -> None:
    assert list(Probes.model_fields) == ["throughput", "rtt", "loss", "mtu"]
    assert set(Probes.model_fields) == set(KINDS)


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's modules, wherever in the module they are."""
    names = {module_name(relative): relative for relative, _ in modules()}
    graph: dict[str, set[str]] = {}
    for relative, path in modules():
        here = module_name(relative)
        package = here if relative.endswith("__init__.py") else here.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    found.add(target if target in names else base)
        graph[here] = {m for m in found if m in names and m != here}
    return graph


def test_no_import_cycle() -> None:
    graph, cycles = imports(), list[frozenset[str]]()

    def visit(module: str, trail: list[str], done: set[str]) -> None:
        if module in trail:
            cycles.append(frozenset(trail[trail.index(module) :]))
            return
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*trail, module], done)
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        visit(module, [], done)
    assert set(cycles) <= KNOWN_CYCLES
