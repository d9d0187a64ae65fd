"""Shared fixtures: temporary databases (SQLite file, and PostgreSQL when TEST_POSTGRES_URL is set),
settings with an instant simulator, and routing clients wired to them.

Databases are cheap: each test process migrates one template per backend once, and every test gets
a fresh copy of it (SQLite: the file copied; PostgreSQL: ``CREATE DATABASE ... TEMPLATE``), so a
test pays milliseconds, not the whole migration chain. The migration tests use ``empty_db_url``
(nothing migrated yet). PostgreSQL databases of tests live beside each other on one server, so
tests run in parallel against it. With REQUIRE_POSTGRES=1 (CI) a missing server is a failure, not
a skip.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support import examples

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("TEST_POSTGRES_URL", "")

# Property tests set their own counts through tests.support.examples; the profiles carry the rest.
settings.register_profile("quick", deadline=None, max_examples=10)
settings.register_profile("thorough", deadline=None, max_examples=100)
settings.load_profile(examples.PROFILE)


# -- Streamlit's AppTest ----------------------------------------------------------------------


_BYTECODE: dict[tuple[str, bytes, bool], Any] = {}


def _bytecode_kept(get_bytecode: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    def kept(cache: Any, script_path: str) -> Any:
        from streamlit import config

        path = os.path.abspath(script_path)
        with open(path, "rb") as f:
            key = (path, f.read(), bool(config.get_option("runner.magicEnabled")))
        if key not in _BYTECODE:
            _BYTECODE[key] = get_bytecode(cache, script_path)
        return _BYTECODE[key]

    kept.kept = True  # type: ignore[attr-defined]
    return kept


@pytest.fixture(autouse=True)
def _apptest_setup_once() -> None:
    """What a Streamlit server does once and ``AppTest`` does on every run, done once per test
    process (once a test has made Streamlit import the code in question):

    - the scan of every installed distribution's metadata for components (0.2 to 0.4 s of CPU per
      new ``AppTest``; the installed set does not change during a test run);
    - compiling each script (the entry, each page): a server keeps the bytecode for its lifetime,
      an ``AppTest`` run starts a new cache. Kept here by path and the file's exact bytes, so an
      edited or new script is compiled afresh.
    """
    scanner = sys.modules.get("streamlit.components.v2.manifest_scanner")
    if scanner is not None and not hasattr(scanner.scan_component_manifests, "cache_info"):
        scanner.scan_component_manifests = functools.cache(scanner.scan_component_manifests)
    scripts = sys.modules.get("streamlit.runtime.scriptrunner.script_cache")
    if scripts is not None and not hasattr(scripts.ScriptCache.get_bytecode, "kept"):
        scripts.ScriptCache.get_bytecode = _bytecode_kept(scripts.ScriptCache.get_bytecode)


# -- SQLite ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head, once per test process; copy it, never open it."""
    from db.engine import create_db_engine
    from db.migrate import upgrade

    path = tmp_path_factory.getbasetemp() / "template.db"
    engine = create_db_engine(f"sqlite:///{path}")
    upgrade(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return path


def copy_sqlite(template: Path, dest: Path) -> str:
    """A migrated database at ``dest`` (a copy of the template), as a URL."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    # sqlite3's backup API, not a file copy: the template's WAL (if a checkpoint left one) comes too.
    src = sqlite3.connect(template)
    out = sqlite3.connect(dest)
    try:
        src.backup(out)
    finally:
        out.close()
        src.close()
    return f"sqlite:///{dest}"


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh SQLite database, already migrated."""
    return copy_sqlite(sqlite_template, tmp_path / "gateway.db")


@pytest.fixture
def empty_sqlite_url(tmp_path: Path) -> str:
    """A SQLite URL with nothing there yet (for the migration tests)."""
    return f"sqlite:///{tmp_path / 'empty.db'}"


# -- PostgreSQL --------------------------------------------------------------------------------


def _require_pg() -> None:
    if not PG_URL:
        if os.environ.get("REQUIRE_POSTGRES") == "1":
            pytest.fail("REQUIRE_POSTGRES=1 but TEST_POSTGRES_URL is not set")
        pytest.skip("TEST_POSTGRES_URL not set (make test starts PostgreSQL and sets it)")


def _pg_db_url(name: str) -> str:
    return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


class _PgDatabases:
    """Creates and drops the test databases on the server of TEST_POSTGRES_URL."""

    def __init__(self) -> None:
        self.admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
        self.template: str | None = None

    def create(self, *, template: str | None = None) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))
        return name

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def migrated_template(self) -> str:
        if self.template is None:
            from db.engine import create_db_engine
            from db.migrate import upgrade

            name = self.create()
            engine = create_db_engine(_pg_db_url(name))
            try:
                upgrade(engine)
            finally:
                engine.dispose()
            self.template = name
        return self.template

    def close(self) -> None:
        if self.template is not None:
            self.drop(self.template)
        self.admin.dispose()


@pytest.fixture(scope="session")
def _pg_databases() -> Iterator[_PgDatabases]:
    _require_pg()
    dbs = _PgDatabases()
    yield dbs
    dbs.close()


def _pg_database(dbs: _PgDatabases, *, migrated: bool) -> Iterator[str]:
    name = dbs.create(template=dbs.migrated_template() if migrated else None)
    try:
        yield _pg_db_url(name)
    finally:
        from db.engine import dispose_all

        dispose_all()
        dbs.drop(name)


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database of the test's own, already migrated."""
    _require_pg()
    yield from _pg_database(request.getfixturevalue("_pg_databases"), migrated=True)


@pytest.fixture
def empty_pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A PostgreSQL database of the test's own with nothing in it (for the migration tests)."""
    _require_pg()
    yield from _pg_database(request.getfixturevalue("_pg_databases"), migrated=False)


# -- both --------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Run a test once on SQLite and once on PostgreSQL (a migrated database of its own)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest) -> str:
    """Like ``db_url``, but nothing migrated yet."""
    return request.getfixturevalue("empty_sqlite_url" if request.param == "sqlite" else "empty_pg_url")


@pytest.fixture
def engine(db_url: str):
    from db.engine import get_engine

    eng = get_engine(db_url)
    yield eng
    from db.engine import dispose_all

    dispose_all()


@pytest.fixture
def settings_factory(tmp_path: Path, sqlite_template: Path):
    """Build validated Settings from TOML text (default: the repo's gateway.toml), instant simulator.
    Without ``database_url``, the database is ``tmp_path/gateway.db`` (a migrated copy)."""
    from app.config import load_settings

    def make(
        toml: str | None = None, *, database_url: str | None = None, latency_scale: float = 0.0, seed: int | None = 7
    ):
        body = toml if toml is not None else (REPO / "gateway.toml").read_text()
        path = tmp_path / f"gateway-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(body)
        if database_url is None:
            default = tmp_path / "gateway.db"
            database_url = f"sqlite:///{default}" if default.exists() else copy_sqlite(sqlite_template, default)
        s = load_settings(path, env={"DATABASE_URL": database_url})
        # Telemetry journals (PostgreSQL's default is ./data/journal) stay inside the test's tmp_path.
        telemetry = s.telemetry
        if telemetry.journal_dir is None:
            telemetry = telemetry.model_copy(update={"journal_dir": str(tmp_path / "journal")})
        return s.model_copy(
            update={
                "simulator": s.simulator.model_copy(update={"latency_scale": latency_scale, "seed": seed}),
                "telemetry": telemetry,
            }
        )

    return make


@pytest.fixture
def client_factory(settings_factory):
    """Routing clients built through the gateway on the given database with an instant simulator;
    closed (gateway and all) after the test."""
    from app.gateway import build_gateway

    made = []

    def make(database_url: str | None = None, toml: str | None = None, **kwargs):
        s = settings_factory(toml, database_url=database_url)
        kwargs.setdefault("sleep", lambda _s: None)
        c = build_gateway(s, **kwargs).client
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
