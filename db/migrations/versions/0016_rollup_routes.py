"""route in every rollup's key: the Monitor filters and breaks down by route and deployment from
the rollups, never the raw log

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

``request_rollup``, ``request_rollup_5m``, ``request_rollup_1h`` and the error-class and
substitution rollups (per minute and per hour) get a ``route`` key column: the ``[routes]`` name an
attempt went to, ``''`` for the two-sided routing. A deployment is (route, provider, model), which
the rollups then key by; the Monitor's route and deployment filters and its by-route and
by-deployment tables read these columns, so their cost stays that of the window's minutes and
combinations, not of the log's size.

Existing cells get ``''``: what was written before this migration shows under no route (the raw
log keeps each row's route; the rollups are not rebuilt from it). The downgrade folds every
route's cells back into the ``''`` cell of their key.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MAIN_KEY = ["minute", "provider", "model", "intent", "source", "side"]
DETAIL_KEY = ["minute", "provider", "model", "requested_model", "intent", "source"]
TABLES = {
    "request_rollup": MAIN_KEY,
    "request_rollup_5m": MAIN_KEY,
    "request_rollup_1h": MAIN_KEY,
    "request_error_rollup": [*DETAIL_KEY, "error_class"],
    "request_error_rollup_1h": [*DETAIL_KEY, "error_class"],
    "request_substitution_rollup": DETAIL_KEY,
    "request_substitution_rollup_1h": DETAIL_KEY,
}


def _add_route(table: str, key: list[str]) -> None:
    """The column, ``''`` in the rows already there (its default only while it is added), and
    the primary key ``key`` + route."""
    conn = op.get_bind()
    op.add_column(table, sa.Column("route", sa.String(128), nullable=False, server_default=""))
    if conn.dialect.name == "postgresql":
        op.alter_column(table, "route", server_default=None)
        name = sa.inspect(conn).get_pk_constraint(table)["name"] or f"{table}_pkey"
        cols = ", ".join([*key, "route"])
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} PRIMARY KEY ({cols})")
        return
    # SQLite: the table is rebuilt with route in its primary key and no default
    route = sa.Column("route", sa.String(128), primary_key=True, nullable=False)
    with op.batch_alter_table(table, recreate="always", reflect_args=[route]):
        pass


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")  # a primary key index is rebuilt
    for table, key in TABLES.items():
        _add_route(table, key)


def downgrade() -> None:
    conn = op.get_bind()
    for table, key in TABLES.items():
        cols = [c["name"] for c in sa.inspect(conn).get_columns(table)]
        sums = [c for c in cols if c not in key and c != "route"]
        keys = ", ".join(key)
        summed = ", ".join(f"SUM({c}) AS {c}" for c in sums)
        op.execute(f"CREATE TEMPORARY TABLE folded_{table} AS SELECT {keys}, {summed} FROM {table} GROUP BY {keys}")
        op.execute(f"DELETE FROM {table}")
        if conn.dialect.name == "postgresql":
            name = sa.inspect(conn).get_pk_constraint(table)["name"]
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
            op.drop_column(table, "route")
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} PRIMARY KEY ({keys})")
        else:
            with op.batch_alter_table(table, recreate="always") as batch:
                batch.drop_column("route")
        names = ", ".join([*key, *sums])
        op.execute(f"INSERT INTO {table} ({names}) SELECT * FROM folded_{table}")
        op.execute(f"DROP TABLE folded_{table}")
