"""The import graph points one way: pages -> ui -> app -> db -> core.

Every ``import`` and ``from ... import`` in every module (including those inside functions, which
are still dependencies) is read with :mod:`ast`, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Any top-level script: nothing below the pages imports them (the dashboard's entry, ui/entry.py, and
# its launchers are checked by test_nothing_imports_the_dashboard_entry).
ENTRY_MODULES = {*(p.stem for p in REPO.glob("*.py"))}
DASHBOARD_ENTRY = {"ui.entry", "ui.asgi", "ui.run"}

# package -> top-level names it must never import
FORBIDDEN: dict[str, set[str]] = {
    "core": {"app", "db", "ui", "pages", "benchmarks", "tests", *ENTRY_MODULES},
    "db": {"app", "ui", "pages", "benchmarks", "tests", *ENTRY_MODULES},
    "app": {"ui", "pages", "streamlit", "benchmarks", "tests", *ENTRY_MODULES},
    "ui": {"pages", "benchmarks", "tests", *ENTRY_MODULES},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def violations(package: str) -> list[str]:
    banned = FORBIDDEN[package]
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if module.split(".")[0] in banned:
                found.append(f"{path.relative_to(REPO)} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    assert (REPO / package).is_dir()
    assert violations(package) == []


def test_nothing_imports_the_dashboard_entry() -> None:
    """ui/entry.py, ui/asgi.py and ui/run.py are scripts Streamlit (or the launcher) runs; no module
    of ours imports them, and the old dashboard/ folder is gone (one place per kind of code)."""
    found = [
        f"{path.relative_to(REPO)} imports {module}"
        for package in ("app", "db", "core", "ui", "pages")
        for path in sorted((REPO / package).rglob("*.py"))
        for module in imported_modules(path)
        if module in DASHBOARD_ENTRY
    ]
    assert found == []
    assert not (REPO / "dashboard").exists() and (REPO / "ui" / "entry.py").is_file()
    assert not (REPO / "ui" / "pages").exists()  # Streamlit's legacy pages mode stays off


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from app.routing import RoutingClient\n    import ui.resources\n")
    assert imported_modules(module) == {"os", "app.routing", "ui.resources"}


def test_simulated_upstreams_do_not_reach_into_routing() -> None:
    """The simulators sit below the router: app.simulated and app.simulator never import app.routing."""
    paths = [REPO / "app" / "simulated.py", *sorted((REPO / "app" / "simulator").rglob("*.py"))]
    assert [str(p) for p in paths for m in imported_modules(p) if m.startswith("app.routing")] == []


# -- no import cycles ------------------------------------------------------------------------------

CYCLE_PACKAGES = ("app", "db", "core", "ui")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root`` (a package's
    ``__init__.py`` is the package's own name)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _ours(dotted: str, known: set[str]) -> str | None:
    """The most specific of our modules that importing ``dotted`` loads (``None``: not ours)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in known:
            return name
    return None


def module_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that module ``name`` (at ``path``) imports anywhere in its body: module level,
    functions, classes. Relative imports are resolved against its package, and ``from pkg import
    sub`` counts as importing ``pkg.sub`` when ``sub`` is a module (else ``pkg``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_ours(alias.name, known) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else _ours(base, known))
        out.update(t for t in targets if t is not None and t != name)
    return out


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = module_files(root, packages)
    known = set(files)
    return {name: module_imports(name, path, known) for name, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, each importing the next, the last importing the first) per
    strongly connected component of more than one module, sorted; ``[]`` when there is none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; our graph is far too small for the recursion limit
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_cycle_in(graph, c) for c in components)


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")  # pragma: no cover


def describe(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_our_packages_have_no_import_cycle() -> None:
    graph = import_graph(REPO, CYCLE_PACKAGES)
    assert "app.monitor.series" in graph and "core.records" in graph  # the walk found our modules
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles (each module imports the next):\n" + describe(cycles)


def test_the_cycle_checker_finds_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    # a -> b by "from pkg import b" (a submodule, not the package), b -> c lazily and relatively,
    # c -> a relatively from a subpackage two levels up; d only imports a (no cycle through d).
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n    return c\n")
    (pkg / "sub" / "c.py").write_text("from ..a import b as _\nimport os\n")
    (pkg / "d.py").write_text("import pkg.a\nfrom pkg.a import b\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a"}
    cycles = find_cycles(graph)
    assert cycles == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert describe(cycles) == "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"

    (pkg / "sub" / "c.py").write_text("import os\n")  # break it
    assert find_cycles(import_graph(tmp_path, ("pkg",))) == []


# -- the routing core does no I/O --------------------------------------------------------------------

#: What sends, waits, reads a clock or takes a thread lock: none of it below the routing core.
IO_LIBRARIES = {"httpx2", "httpx", "openai", "pyreqwest", "anyio", "asyncio", "threading", "time", "socket"}


def routing_core(graph: dict[str, set[str]]) -> list[str]:
    """The core modules: every module of app.routing outside its io package (and the package's
    ``__init__``, the drivers' front door)."""
    return sorted(m for m in graph if m.startswith("app.routing.") and not m.startswith("app.routing.io"))


def io_imports(root: Path, packages: tuple[str, ...], start: list[str]) -> list[str]:
    """``module imports library`` for every I/O library imported by ``start`` or by any module of
    ours that they import, directly or not (a helper of ours cannot carry the I/O in)."""
    graph = import_graph(root, packages)
    files = module_files(root, packages)
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return sorted(
        f"{name} imports {module}"
        for name in seen
        for module in imported_modules(files[name])
        if module.split(".")[0] in IO_LIBRARIES or module.startswith("app.routing.io")
    )


def test_the_routing_core_imports_no_io() -> None:
    graph = import_graph(REPO, CYCLE_PACKAGES)
    core = routing_core(graph)
    assert {"app.routing.core", "app.routing.policy", "app.routing.errors", "app.routing.result"} <= set(core)
    assert not any(m.startswith("app.routing.io") for m in core)
    assert io_imports(REPO, CYCLE_PACKAGES, core) == []


def test_the_io_checker_sees_an_io_import_through_a_helper(tmp_path: Path) -> None:
    pkg = tmp_path / "app"
    (pkg / "routing" / "io").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "routing" / "__init__.py", pkg / "routing" / "io" / "__init__.py"):
        init.write_text("")
    (pkg / "routing" / "core.py").write_text("from app import helper\n")
    (pkg / "helper.py").write_text("def now():\n    import time\n    return time.time()\n")
    (pkg / "routing" / "io" / "client.py").write_text("import httpx2\n")
    graph = import_graph(tmp_path, ("app",))
    assert routing_core(graph) == ["app.routing.core"]
    assert io_imports(tmp_path, ("app",), routing_core(graph)) == ["app.helper imports time"]
    (pkg / "routing" / "core.py").write_text("from app.routing.io import client\n")
    assert io_imports(tmp_path, ("app",), ["app.routing.core"]) == [
        "app.routing.core imports app.routing.io",
        "app.routing.io.client imports httpx2",
    ]
