"""Database layer: migrations, schema drift against the models, SQLite settings, the canary repository
(optimistic locking, audit trail, validation) and the fault-injection repository.
"""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from db import canary
from db.engine import create_db_engine, dispose_all, get_engine
from db.migrate import alembic_config, at_head, current_tables, upgrade
from db.models import Base

EXPECTED_TABLES = sorted(Base.metadata.tables)


def _head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _version(engine) -> list[str]:
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()


# -- migrations ------------------------------------------------------------------------------------


def test_migrations_create_every_table_on_a_new_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "fresh.db"
    assert not path.exists()
    url = f"sqlite:///{path}"
    try:
        engine = get_engine(url)
        assert path.exists()
        assert set(EXPECTED_TABLES) <= set(current_tables(engine))
        assert _version(engine) == [_head()]
    finally:
        dispose_all()


def test_migrations_apply_on_a_new_database(empty_db_url: str) -> None:
    engine = create_db_engine(empty_db_url)
    try:
        assert current_tables(engine) == []
        upgrade(engine)
        tables = current_tables(engine)
        assert set(EXPECTED_TABLES) <= set(tables)
        assert "alembic_version" in tables
        assert _version(engine) == [_head()]
    finally:
        engine.dispose()


def test_applying_migrations_twice_is_a_noop(engine) -> None:
    canary.ensure_setting(engine, 0.2)
    canary.set_ratio(engine, 0.4, expected_version=None, actor="alice", reason="before re-migrate")
    insp = inspect(engine)
    before = {t: sorted(c["name"] for c in insp.get_columns(t)) for t in current_tables(engine)}
    before_idx = {t: sorted(i["name"] for i in insp.get_indexes(t)) for t in current_tables(engine)}

    # By revision id, not "head": Alembic itself runs (for "head", an up-to-date database is
    # recognised without it).
    upgrade(engine, _head())
    upgrade(engine, _head())
    assert at_head(engine)

    insp = inspect(engine)
    assert {t: sorted(c["name"] for c in insp.get_columns(t)) for t in current_tables(engine)} == before
    assert {t: sorted(i["name"] for i in insp.get_indexes(t)) for t in current_tables(engine)} == before_idx
    assert _version(engine) == [_head()]
    state = canary.get_state(engine)
    assert (state.ratio, state.updated_by) == (0.4, "alice")
    assert canary.audit_count(engine) == 1


def test_models_and_migrated_schema_do_not_drift(engine) -> None:
    with engine.connect() as conn:
        mc = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diff = compare_metadata(mc, Base.metadata)
    assert diff == [], f"db.models and the migrations disagree: {diff}"


# -- canary repository -------------------------------------------------------------------------


# -- faults repository -------------------------------------------------------------------------
