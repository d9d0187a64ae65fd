"""Engine and session factory, one per database URL per process, with schema migration on start.

SQLite runs in WAL mode with a busy timeout so the telemetry writer, the canary page and readers in
other processes share one file without ``database is locked``; transactions are begun explicitly
(the pysqlite driver's own implicit BEGIN handling is turned off) so each one is atomic.
"""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN")


def create_db_engine(url: str) -> Engine:
    """A new engine for ``url`` (creates the SQLite file's folder if needed)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _sqlite_setup(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def get_engine(url: str, *, migrate: bool = True) -> Engine:
    """The process-wide engine for ``url``; the schema is brought up to date on first use."""
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = create_db_engine(url)
            if migrate:
                from db.migrate import upgrade

                upgrade(engine)
            _engines[url] = engine
        return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def dispose_all() -> None:
    """Close every cached engine (tests, shutdown)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
