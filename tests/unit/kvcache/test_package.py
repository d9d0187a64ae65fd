"""kvcache is a product of its own: every module imports only the standard library and kvcache, and
the package imports in a process where nothing else of ours (nor any third-party package) can load."""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import sys
from pathlib import Path

import pytest

from tests.support import paths

PACKAGE = paths.REPO / "kvcache"


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_every_module_imports_only_the_standard_library_and_itself() -> None:
    outside = {
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in imports(path)
        if name != "kvcache" and name not in sys.stdlib_module_names and name != "__future__"
    }
    assert outside == set()


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses every top-level import that is neither the standard library nor kvcache."""

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top != "kvcache" and top not in sys.stdlib_module_names:
            raise ImportError(f"kvcache needs {fullname}")
        return None


def test_it_imports_and_computes_with_nothing_else_available(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = {k: v for k, v in sys.modules.items() if k == "kvcache" or k.startswith("kvcache.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Refuse(), *sys.meta_path])
    try:
        kv = importlib.import_module("kvcache")
        for path in sorted(PACKAGE.glob("*.py")):
            importlib.import_module(f"kvcache.{path.stem}" if path.stem != "__init__" else "kvcache")
        spec = kv.model_spec(next(iter(kv.models())))
        assert kv.kv_cache_bytes(spec, seq_len=1024, batch=1, kv_dtype="bf16") > 0
    finally:
        for name in [k for k in sys.modules if k == "kvcache" or k.startswith("kvcache.")]:
            del sys.modules[name]
        sys.modules.update(saved)
