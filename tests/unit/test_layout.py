"""Tests mirror the code: every module of app/, core/, db/, kvcache/, ui/ and pages/ has its test
file (tests/unit/... or tests/integration/..., see tests/README.md), or a line in the README's table
of modules without one saying why."""

from __future__ import annotations

import re

from tests.support.paths import REPO

PACKAGES = ("app", "core", "db", "kvcache", "ui", "pages")


def mirrored(module: str) -> str:
    """``app/routing/core.py`` -> ``routing/test_core.py`` (under tests/unit or tests/integration);
    modules directly under app/ go to ``app/``."""
    *folders, file = module.removesuffix(".py").split("/")
    if folders[0] == "app" and len(folders) > 1:
        folders = folders[1:]
    name = "main" if file == "__main__" else file
    return "/".join([*folders, f"test_{name}.py"])


def modules() -> list[str]:
    return sorted(
        str(p.relative_to(REPO))
        for package in PACKAGES
        for p in (REPO / package).rglob("*.py")
        if p.name != "__init__.py" and "migrations" not in p.parts
    )


def explained() -> set[str]:
    text = (REPO / "tests" / "README.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([^`]+\.py)` \|", text, flags=re.M))


def test_mirrored_paths() -> None:
    assert mirrored("app/routing/core.py") == "routing/test_core.py"
    assert mirrored("app/__main__.py") == "app/test_main.py"
    assert mirrored("app/config.py") == "app/test_config.py"
    assert mirrored("db/limits.py") == "db/test_limits.py"


def test_every_module_has_its_test_file_or_a_reason() -> None:
    reasons = explained()
    lacking = [
        m
        for m in modules()
        if m not in reasons
        and not any((REPO / "tests" / tier / mirrored(m)).is_file() for tier in ("unit", "integration"))
    ]
    assert lacking == [], "add a test file or a line in tests/README.md for each"


def test_no_reason_outlives_its_module_or_stands_beside_a_test_file() -> None:
    for module in sorted(explained()):
        assert (REPO / module).is_file(), f"tests/README.md explains {module}, which is gone"
        has_file = any((REPO / "tests" / tier / mirrored(module)).is_file() for tier in ("unit", "integration"))
        assert not has_file, f"{module} has its test file now: drop its line from tests/README.md"
