"""The canary preview from the command line: canary set --dry-run as operators run it (a subprocess)."""

from __future__ import annotations

import time

from core.records import AttemptRecord
from db.requests import insert_batch
from tests.integration.app.test_main import _audit_count, _one_error_line, cli  # noqa: F401  (fixture)

DS = "deepseek-chat-v3.2"  # gateway.toml: only holysheep (the primary) serves it


def test_dry_run_prints_the_preview_and_writes_nothing(cli) -> None:  # noqa: F811
    from db.engine import dispose_all, get_engine

    engine = get_engine(cli.database_url)
    now = time.time()
    rows = [
        AttemptRecord(f"q{i}", 1, now - 100 + i, "holysheep", DS, DS, "coding", "primary", "ok", 5.0) for i in range(8)
    ]
    insert_batch(engine, rows)
    dispose_all()
    before = _audit_count(cli.database_url)
    r = cli.run("canary", "set", "0", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "8 requests" in r.stdout and "dry run: nothing written" in r.stdout
    assert f"{DS} (coding)" in r.stdout
    assert _audit_count(cli.database_url) == before
    # A bad ratio is refused, dry run or not (every bad number, and the reason a change without
    # --dry-run requires, in-process: tests/unit/app/test_main.py).
    assert "ratio" in _one_error_line(cli.run("canary", "set", "nan", "--dry-run")).lower()
    assert _audit_count(cli.database_url) == before
