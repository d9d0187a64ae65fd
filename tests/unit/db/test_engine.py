"""Engines: SQLite's WAL mode, busy timeout and atomic transactions, PostgreSQL's session timeouts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import select

from db import canary
from db.engine import create_db_engine, dispose_all, get_engine
from db.migrate import current_tables, upgrade
from db.models import Base, CanaryAudit

EXPECTED_TABLES = sorted(Base.metadata.tables)


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(sqlite_url: str) -> None:
    from db.engine import DbTimeouts

    engine = get_engine(sqlite_url, timeouts=DbTimeouts(lock_timeout_s=7.5))
    try:
        results: list[tuple] = []

        def probe() -> None:
            with engine.connect() as conn:
                results.append(
                    (
                        conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
                        conn.exec_driver_sql("PRAGMA busy_timeout").scalar(),
                    )
                )

        # Every pooled connection, including ones opened on other threads, gets the settings.
        probe()
        threads = [threading.Thread(target=probe) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 4
        for mode, timeout in results:
            assert str(mode).lower() == "wal"
            assert int(timeout) == 7500
    finally:
        dispose_all()


@pytest.mark.postgres
def test_postgres_sessions_have_statement_and_lock_timeouts(pg_url: str) -> None:
    from db.engine import DbTimeouts

    url = f"{pg_url}?options=-csearch_path%3Dpublic,pg_catalog"  # an option of the URL's own
    engine = get_engine(url, timeouts=DbTimeouts(statement_timeout_s=12, lock_timeout_s=3))
    try:
        with engine.connect() as conn:
            statement = conn.exec_driver_sql("SHOW statement_timeout").scalar()
            lock = conn.exec_driver_sql("SHOW lock_timeout").scalar()
            path = conn.exec_driver_sql("SHOW search_path").scalar()
        assert (statement, lock) == ("12s", "3s")
        assert path == "public,pg_catalog"  # the URL's own options are kept
    finally:
        dispose_all()


def test_sqlite_transactions_are_atomic(sqlite_url: str) -> None:
    """The engine begins transactions itself; a failed block must leave nothing behind."""
    engine = get_engine(sqlite_url)
    try:
        canary.ensure_setting(engine, 0.1)
        with pytest.raises(RuntimeError):
            with engine.begin() as conn:
                conn.execute(
                    CanaryAudit.__table__.insert().values(
                        ts=1.0, old_ratio=0.1, new_ratio=0.2, version=2, actor="x", reason="y"
                    )
                )
                raise RuntimeError("abort")
        assert canary.audit_count(engine) == 0
    finally:
        dispose_all()


def test_create_db_engine_without_migration_makes_no_tables(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'raw.db'}")
    try:
        assert current_tables(engine) == []
        upgrade(engine)
        assert set(EXPECTED_TABLES) <= set(current_tables(engine))
        with engine.connect() as conn:
            assert conn.execute(select(CanaryAudit.id)).first() is None
    finally:
        engine.dispose()
