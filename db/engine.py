"""Engine and session factory, one per database URL per process, with schema migration on start.

SQLite runs in WAL mode with a busy timeout so the telemetry writer, the canary page and readers in
other processes share one file without ``database is locked``; transactions are begun explicitly
(the pysqlite driver's own implicit BEGIN handling is turned off) so each one is atomic.

Every engine has bounded waits, so a database that hangs delays a caller by seconds, not forever:
SQLite waits at most ``lock_timeout_s`` for a lock (``timeout`` / ``busy_timeout``); PostgreSQL
gets ``connect_timeout`` and per-session ``statement_timeout`` and ``lock_timeout``. The values come
from the ``[database]`` table of the gateway config (see :class:`DbTimeouts` for the defaults).

Engines are created with ``hide_parameters=True``: a failed statement's error text (which the
telemetry writer logs and the CLI may show) never carries the bound values (session ids, prompt
text, error messages from upstreams), only the SQL.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


@dataclass(frozen=True)
class DbTimeouts:
    connect_timeout_s: float = 5.0  # PostgreSQL: give up connecting after this
    statement_timeout_s: float = 30.0  # PostgreSQL: cancel a statement running longer
    lock_timeout_s: float = 10.0  # both: give up waiting for a lock (SQLite: busy_timeout)


DEFAULT_TIMEOUTS = DbTimeouts()

log = logging.getLogger(__name__)
_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def _sqlite_setup(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # A transaction that reads before it writes (the idempotent batch insert) takes the write
        # lock up front: upgrading a read transaction while another writer holds the lock fails at
        # once with "database is locked" instead of waiting out the busy timeout.
        immediate = conn.get_execution_options().get("sqlite_immediate")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _pg_options(url: str, timeouts: DbTimeouts) -> str:
    """The libpq ``options`` value: ours, after any the URL already carries (e.g. search_path)."""
    ours = (
        f"-c statement_timeout={round(timeouts.statement_timeout_s * 1000)} "
        f"-c lock_timeout={round(timeouts.lock_timeout_s * 1000)}"
    )
    given = make_url(url).query.get("options")
    given = " ".join(given) if isinstance(given, tuple) else given
    return f"{given} {ours}" if given else ours


def create_db_engine(url: str, timeouts: DbTimeouts = DEFAULT_TIMEOUTS) -> Engine:
    """A new engine for ``url`` (creates the SQLite file's folder if needed)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": timeouts.lock_timeout_s},
            hide_parameters=True,
        )
        _sqlite_setup(engine, round(timeouts.lock_timeout_s * 1000))
        return engine
    connect_args = {
        "connect_timeout": max(1, round(timeouts.connect_timeout_s)),
        "options": _pg_options(url, timeouts),
    }
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args, hide_parameters=True
    )


def get_engine(url: str, *, migrate: bool = True, timeouts: DbTimeouts | None = None) -> Engine:
    """The process-wide engine for ``url``; the schema is brought up to date on first use.

    ``timeouts`` apply when this call creates the engine (the first one for ``url`` wins).
    """
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = create_db_engine(url, timeouts or DEFAULT_TIMEOUTS)
            log.debug("engine for %s created", engine.url.render_as_string(hide_password=True))
            if migrate:
                from db.migrate import upgrade

                upgrade(engine)
            _engines[url] = engine
        return engine


def dispose_all() -> None:
    """Close every cached engine (tests, shutdown)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
