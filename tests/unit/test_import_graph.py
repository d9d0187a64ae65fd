"""The import graph points one way: pages -> ui -> app -> db -> core.

Every ``import`` and ``from ... import`` in every module (including those inside functions, which
are still dependencies) is read with :mod:`ast`, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The dashboard entry (dashboard/entry.py) and any top-level script: nothing below the pages imports them.
ENTRY_MODULES = {"dashboard", *(p.stem for p in REPO.glob("*.py"))}

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


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from app.routing import RoutingClient\n    import ui.resources\n")
    assert imported_modules(module) == {"os", "app.routing", "ui.resources"}


def test_simulated_upstreams_do_not_reach_into_routing() -> None:
    """The simulators sit below the router: app.simulated and app.simulator never import app.routing."""
    paths = [REPO / "app" / "simulated.py", *sorted((REPO / "app" / "simulator").rglob("*.py"))]
    assert [str(p) for p in paths for m in imported_modules(p) if m.startswith("app.routing")] == []
