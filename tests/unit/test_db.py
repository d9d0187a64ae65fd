"""Database layer: migrations, schema drift against the models, SQLite settings, the canary repository
(optimistic locking, audit trail, validation) and the fault-injection repository.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select, text

from core.faults import FaultSettings
from db import canary
from db.canary import StaleCanaryError
from db.engine import create_db_engine, dispose_all, get_engine
from db.migrate import alembic_config, at_head, current_tables, upgrade
from db.models import Base, CanaryAudit

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
        assert path == "public, pg_catalog"  # the URL's own options are kept
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


# -- canary repository -------------------------------------------------------------------------


def test_ensure_setting_creates_the_row_once(engine) -> None:
    canary.ensure_setting(engine, 0.15)
    canary.ensure_setting(engine, 0.9)  # later calls keep what is there
    s = canary.get_state(engine)
    assert s.ratio == 0.15
    assert s.version == 1
    assert canary.read_ratio_version(engine) == (0.15, 1)


def test_stale_expected_version_is_refused_naming_who_changed_it(engine) -> None:
    canary.ensure_setting(engine, 0.1)
    loaded = canary.get_state(engine)
    canary.set_ratio(engine, 0.3, expected_version=loaded.version, actor="alice", reason="ramp up")
    audits = canary.audit_count(engine)
    after_alice = canary.get_state(engine)

    with pytest.raises(StaleCanaryError) as info:
        canary.set_ratio(engine, 0.9, expected_version=loaded.version, actor="bob", reason="stale page")
    msg = str(info.value)
    assert "alice" in msg
    assert "30 %" in msg
    assert info.value.current.updated_by == "alice"
    assert info.value.current.ratio == 0.3
    assert info.value.current.version == after_alice.version
    # Nothing was written.
    assert canary.audit_count(engine) == audits
    assert canary.get_state(engine) == after_alice


def test_concurrent_writers_with_the_same_version_exactly_one_wins(engine) -> None:
    canary.ensure_setting(engine, 0.1)
    v = canary.get_state(engine).version
    start = threading.Barrier(4)
    outcomes: list[object] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        start.wait()
        try:
            s = canary.set_ratio(engine, 0.2 + i / 10, expected_version=v, actor=f"op{i}", reason="race")
            out: object = s
        except StaleCanaryError as exc:
            out = exc
        with lock:
            outcomes.append(out)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [o for o in outcomes if isinstance(o, canary.CanaryState)]
    losses = [o for o in outcomes if isinstance(o, StaleCanaryError)]
    assert len(wins) == 1 and len(losses) == 3
    assert canary.audit_count(engine) == 1
    final = canary.get_state(engine)
    assert final == wins[0]
    assert final.version == v + 1


def test_audit_rows_record_old_new_actor_reason(engine) -> None:
    canary.ensure_setting(engine, 0.1)
    canary.set_ratio(engine, 0.25, expected_version=1, actor="alice", reason="first step", now=1000.0)
    canary.set_ratio(engine, 0.5, expected_version=None, actor="bob", reason="second step", now=2000.0)
    log = canary.audit_log(engine)
    assert [(a.old_ratio, a.new_ratio, a.actor, a.reason, a.version) for a in log] == [
        (0.25, 0.5, "bob", "second step", 3),
        (0.1, 0.25, "alice", "first step", 2),
    ]
    assert [a.ts for a in log] == [2000.0, 1000.0]
    assert canary.audit_log(engine, since=1500.0)[0].actor == "bob"
    assert len(canary.audit_log(engine, since=1500.0)) == 1
    assert canary.audit_log(engine, limit=1)[0].actor == "bob"
    state = canary.get_state(engine)
    assert (state.ratio, state.version, state.updated_by, state.reason) == (0.5, 3, "bob", "second step")


@pytest.mark.parametrize("bad", [-0.1, 1.1, "abc", math.nan, True, False, math.inf, "nan", None, "1.5"])
def test_invalid_ratio_writes_nothing(engine, bad) -> None:
    canary.ensure_setting(engine, 0.1)
    before = canary.get_state(engine)
    with pytest.raises(ValueError):
        canary.set_ratio(engine, bad, expected_version=None, actor="alice", reason="bad input")
    with pytest.raises(ValueError):
        canary.set_ratio(engine, bad, expected_version=before.version, actor="alice", reason="bad input")
    assert canary.audit_count(engine) == 0
    assert canary.get_state(engine) == before


@pytest.mark.parametrize("actor,reason", [("", "why"), ("   ", "why"), ("alice", ""), ("alice", "x" * 501)])
def test_missing_actor_or_reason_writes_nothing(engine, actor: str, reason: str) -> None:
    canary.ensure_setting(engine, 0.1)
    before = canary.get_state(engine)
    with pytest.raises(ValueError):
        canary.set_ratio(engine, 0.5, expected_version=None, actor=actor, reason=reason)
    assert canary.audit_count(engine) == 0
    assert canary.get_state(engine) == before


@pytest.mark.parametrize("good,expected", [(0, 0.0), (1, 1.0), ("0.25", 0.25), (0.999, 0.999)])
def test_valid_ratios_are_accepted(engine, good, expected: float) -> None:
    canary.ensure_setting(engine, 0.1)
    state = canary.set_ratio(engine, good, expected_version=None, actor="alice", reason="ok")
    assert state.ratio == expected
    assert canary.get_state(engine).ratio == expected
    assert canary.audit_count(engine) == 1


# -- faults repository -------------------------------------------------------------------------


def test_faults_round_trip(engine) -> None:
    from db.faults import all_faults, clear_faults, get_faults, set_faults

    assert get_faults(engine, "holysheep") is None
    assert all_faults(engine) == {}
    f1 = FaultSettings(
        error_rate=0.25,
        rate_limit_rate=0.1,
        retry_after_s=2.5,
        timeout_rate=0.05,
        latency_multiplier=3.0,
        reject_cache_hints=True,
        stream_break_rate=0.2,
    )
    set_faults(engine, "holysheep", f1, actor="alice")
    assert get_faults(engine, "holysheep") == f1
    assert get_faults(engine, "direct") is None

    f2 = FaultSettings(error_rate=1.0)
    set_faults(engine, "holysheep", f2, actor="bob")  # update in place, not a second row
    set_faults(engine, "direct", f1, actor="bob")
    assert get_faults(engine, "holysheep") == f2
    assert all_faults(engine) == {"holysheep": f2, "direct": f1}

    clear_faults(engine, "holysheep")
    assert get_faults(engine, "holysheep") is None
    assert all_faults(engine) == {"direct": f1}


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


def test_overlong_actor_is_refused_before_the_database(engine) -> None:
    """canary_setting.updated_by / canary_audit.actor are VARCHAR(128): a longer actor is refused with
    a ValueError for the operator (not a raw DataError from PostgreSQL) and nothing is written; an
    actor of exactly 128 characters is stored intact."""
    canary.ensure_setting(engine, 0.1)
    before = canary.get_state(engine)
    with pytest.raises(ValueError, match=r"actor is too long \(129 characters, at most 128\)"):
        canary.set_ratio(engine, 0.3, expected_version=None, actor="a" * 129, reason="long name")
    assert canary.audit_count(engine) == 0
    assert canary.get_state(engine) == before

    widest = "b" * 128
    state = canary.set_ratio(engine, 0.3, expected_version=None, actor=widest, reason="long name")
    assert state.updated_by == widest
    assert canary.get_state(engine).updated_by == widest
    assert [e.actor for e in canary.audit_log(engine)] == [widest]


def test_concurrent_first_start_migrates_a_new_sqlite_file_once(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
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
