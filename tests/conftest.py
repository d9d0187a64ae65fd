"""Shared fixtures: temporary databases (SQLite file, and PostgreSQL when TEST_POSTGRES_URL is set),
settings with an instant simulator, and routing clients wired to them.

PostgreSQL tests get a schema of their own per test (via the connection's search_path), so they can
run in parallel against one server. With REQUIRE_POSTGRES=1 (CI) a missing server is a failure, not a
skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("TEST_POSTGRES_URL", "")


def _pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    if not PG_URL:
        if os.environ.get("REQUIRE_POSTGRES") == "1":
            pytest.fail("REQUIRE_POSTGRES=1 but TEST_POSTGRES_URL is not set")
        pytest.skip("TEST_POSTGRES_URL not set (make test starts PostgreSQL and sets it)")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield _pg_schema_url(schema)
    finally:
        from db.engine import dispose_all

        dispose_all()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Run a test once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def engine(db_url: str):
    from db.engine import get_engine

    eng = get_engine(db_url)
    yield eng
    from db.engine import dispose_all

    dispose_all()


@pytest.fixture
def settings_factory(tmp_path: Path):
    """Build validated Settings from TOML text (default: the repo's gateway.toml), instant simulator."""
    from app.config import load_settings

    def make(
        toml: str | None = None, *, database_url: str | None = None, latency_scale: float = 0.0, seed: int | None = 7
    ):
        body = toml if toml is not None else (REPO / "gateway.toml").read_text()
        path = tmp_path / f"gateway-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(body)
        env = {"DATABASE_URL": database_url or f"sqlite:///{tmp_path / 'gateway.db'}"}
        s = load_settings(path, env=env)
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
