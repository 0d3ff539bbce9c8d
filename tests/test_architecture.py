"""Imports point inward (docs/ARCHITECTURE.md): the pure core imports no edge, the service
does not import the emulated world, and nothing but the CLI reaches the CLI or the
benchmarks. Read from the source as written (function-level and TYPE_CHECKING imports
count too), so a new arrow the wrong way fails here before it settles in."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SHADOW = Path(__file__).resolve().parents[1] / "shadow"

#: the pure core: plain data in, plain data out
CORE = (
    "shadow.policies",
    "shadow.predict",
    "shadow.replay",
    "shadow.events",
    "shadow.stream",
    "shadow.analysis",
    "shadow.workloads",
    "shadow.modes.machine",
    "shadow.gate.evidence",
    "shadow.gate.thresholds",
    "shadow.gate.statistics",
    "shadow.gate.verdict",
)
#: what talks to the outside (files, sockets, DuckDB, processes, people)
EDGES = (
    "shadow.service",
    "shadow.storage",
    "shadow.connectors",
    "shadow.world",
    "shadow.sweep",
    "shadow.ui",
    "shadow.dashboards",
    "shadow.cli",
    "shadow.bench",
)
#: (importer, what it must not import): the edges' own order
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((core, EDGES) for core in CORE),
    ("shadow.service", ("shadow.world", "shadow.cli", "shadow.bench")),
    (
        "shadow.storage",
        (
            "shadow.service",
            "shadow.connectors",
            "shadow.world",
            "shadow.sweep",
            "shadow.cli",
            "shadow.bench",
        ),
    ),
    (
        "shadow.connectors",
        ("shadow.service", "shadow.storage", "shadow.world", "shadow.cli", "shadow.bench"),
    ),
    ("shadow.gate", ("shadow.service", "shadow.world", "shadow.cli", "shadow.bench")),
    ("shadow.modes", ("shadow.service", "shadow.world", "shadow.cli", "shadow.bench")),
    ("shadow.sweep", ("shadow.service", "shadow.world", "shadow.cli", "shadow.bench")),
    ("shadow.world", ("shadow.cli", "shadow.bench")),
    ("shadow.dashboards", ("shadow.world", "shadow.cli", "shadow.bench")),
    # inside the core: the simulator knows no workload source and no metric, which are
    # built on it (a replay run, retime -> replay -> summarise, is analysis/replay_run)
    ("shadow.replay", ("shadow.analysis", "shadow.workloads")),
    ("shadow.workloads", ("shadow.analysis",)),
    # BR-H's policies hold predictors; a predictor reads the active set (predict/active)
    ("shadow.predict", ("shadow.policies",)),
)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_imports(root: Path) -> Iterator[tuple[str, str, int]]:
    """(module, imported module, line) for every absolute import under `root/shadow`."""
    for path in sorted((root / "shadow").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
                if node.module == "shadow":  # `from shadow import events`
                    targets = [f"shadow.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                yield module, target, node.lineno


def wrong_way(root: Path) -> list[str]:
    found = []
    for module, target, line in module_imports(root):
        for importer, forbidden in RULES:
            if _within(module, importer) and any(_within(target, f) for f in forbidden):
                found.append(f"{module}:{line} imports {target} ({importer} must not)")
    return sorted(set(found))


def test_imports_point_inward() -> None:
    assert wrong_way(SHADOW.parent) == []


def test_every_package_is_placed() -> None:
    """A new top-level package must be given a place (core or edge) before it lands."""
    placed = {name.split(".")[1] for name in (*CORE, *EDGES)} | {"gate", "modes"}
    packages = {p.name for p in SHADOW.iterdir() if (p / "__init__.py").exists()}
    assert packages - placed == set()


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("policies/leak.py", "from shadow.service.store import ServiceStore\n"),
        ("replay/leak.py", "def f():\n    import shadow.storage.database\n"),
        ("replay/leak.py", "from shadow.analysis.metrics import summarize\n"),
        ("predict/leak.py", "from shadow.policies.snapshot import FleetSnapshot\n"),
        ("stream/leak.py", "from shadow import world\n"),
        ("service/leak.py", "from shadow.world.demo import DemoPlan\n"),
    ],
)
def test_a_wrong_way_import_is_caught(tmp_path: Path, module: str, line: str) -> None:
    """The check itself can fail: a planted import the wrong way is reported."""
    path = tmp_path / "shadow" / module
    path.parent.mkdir(parents=True)
    path.write_text(line)
    assert len(wrong_way(tmp_path)) == 1


def module_graph(root: Path) -> dict[str, set[str]]:
    """Each module under `root/shadow` -> the modules it imports. `from a.b import c`
    names the module `a.b.c` when there is one (a submodule, not a name of `a.b`)."""
    paths = sorted((root / "shadow").rglob("*.py"))
    names = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in paths
    }
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in names else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[module] = {t for t in targets if t in names and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def test_no_two_modules_import_each_other() -> None:
    """No import cycle, however long, TYPE_CHECKING and function-level imports included:
    a module that needs a type of the module importing it takes it from a third (the
    mirror's records and the BR config moved out for this; the tree of 48b3c04 has two)."""
    assert import_cycles(module_graph(SHADOW.parent)) == []


def test_an_import_cycle_is_caught(tmp_path: Path) -> None:
    """The check itself can fail: three planted modules in a ring are reported as one."""
    package = tmp_path / "shadow" / "ring"
    package.mkdir(parents=True)
    (tmp_path / "shadow" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from shadow.ring import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from shadow.ring.c import C\n")  # fmt: skip
    (package / "c.py").write_text("def f():\n    import shadow.ring.a\n")
    (package / "d.py").write_text("from shadow.ring import a\n")  # imports the ring, not in it
    assert import_cycles(module_graph(tmp_path)) == [
        ["shadow.ring.a", "shadow.ring.b", "shadow.ring.c"]
    ]
