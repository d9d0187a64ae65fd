"""Alembic migrations applied programmatically: ``upgrade(engine)`` brings a database to head.

A database already at head is recognised by one read of ``alembic_version`` against the head
revision (read from the scripts once per process), so opening an up-to-date database does not run
Alembic's environment at all. Two processes starting together (the dashboard and a CLI command, say)
may both try to migrate. On SQLite the migration's transaction takes the write lock when it begins
(``BEGIN IMMEDIATE``): one that first read and then wrote would fail at once, without waiting, while
another process migrates. A process that finds the lock held waits for it (the busy timeout) and
tries again until ``RACE_WAIT_S`` have passed; by then the winner has committed and there is
nothing left to do. A database that does not answer is tried three times, then reported.
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


RACE_WAIT_S = 120.0  # how long a process waits for another's migration before giving up


def upgrade(engine: Engine, revision: str = "head") -> None:
    if revision == "head" and at_head(engine):
        return
    give_up = time.monotonic() + RACE_WAIT_S
    attempt = 0
    while True:
        attempt += 1
        try:
            with engine.execution_options(sqlite_immediate=True).begin() as conn:
                cfg = alembic_config(engine)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            return
        except DBAPIError as exc:
            # Another process migrating holds a lock: wait for it. Anything else (a database that
            # does not answer) is tried three times, then said.
            if time.monotonic() >= give_up or (attempt >= 3 and not _lock_contention(exc)):
                raise
            log.info("migration raced another process (attempt %d); retrying", attempt)
            time.sleep(min(0.5 * attempt, 2.0))


# PostgreSQL: lock_timeout, a table or version row another process created first, serialization.
_RACE_SQLSTATES = frozenset({"55P03", "42P07", "23505", "40001", "40P01"})


def _lock_contention(exc: DBAPIError) -> bool:
    """Whether ``exc`` is another process's migration in the way (not a database that is down)."""
    if getattr(exc.orig, "sqlstate", None) in _RACE_SQLSTATES:
        return True
    return "database is locked" in str(exc.orig)


def current_tables(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())
