"""Alembic migrations applied programmatically: ``upgrade(engine)`` brings a database to head.

A database already at head is recognised by one read of ``alembic_version`` against the head
revision (read from the scripts once per process), so opening an up-to-date database does not run
Alembic's environment at all. Two processes starting together (the dashboard and a CLI command, say)
may both try to migrate; the loser of that race retries once after the winner has committed.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        cfg.attributes["engine"] = engine
        cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


@cache
def head_revision() -> str | None:
    """The newest revision of the migration scripts."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def at_head(engine: Engine) -> bool:
    """Whether the database's schema is already the newest revision."""
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return False
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except DBAPIError:
        return False
    return versions == [head_revision()]


def upgrade(engine: Engine, revision: str = "head") -> None:
    if revision == "head" and at_head(engine):
        return
    for attempt in range(3):
        try:
            with engine.begin() as conn:
                cfg = alembic_config(engine)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            return
        except DBAPIError:
            if attempt == 2:
                raise
            log.info("migration raced another process (attempt %d); retrying", attempt + 1)
            time.sleep(0.5 * (attempt + 1))


def current_tables(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())
