"""Migrations under real concurrency: processes starting together on a new database."""

from __future__ import annotations

from pathlib import Path

from alembic.script import ScriptDirectory
from sqlalchemy import text

from db import canary
from db.engine import dispose_all, get_engine
from db.migrate import alembic_config
from tests.support import paths


def _head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _version(engine) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()


def test_concurrent_first_start_migrates_a_new_sqlite_file_once(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = paths.REPO
    url = f"sqlite:///{tmp_path / 'race.db'}"
    code = (
        "import sys; from db.engine import get_engine; from db.canary import ensure_setting, get_state; "
        "e = get_engine(sys.argv[1]); ensure_setting(e, 0.1); print(get_state(e).version)"
    )
    env = {**os.environ, "PYTHONPATH": str(repo)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, url],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=False):
        assert p.returncode == 0, err
        assert out.strip() == "1"
    engine = get_engine(url)
    try:
        assert _version(engine) == [_head()]
        assert canary.audit_count(engine) == 0
    finally:
        dispose_all()
