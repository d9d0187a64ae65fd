"""request_log at 36 M rows a day: day partitions on PostgreSQL, a (session_id, ts) index, and a
unique key that includes ts

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

Both databases:

- ``ux_request_log_request_attempt`` (request_id, attempt) becomes
  ``ux_request_log_request_attempt_ts`` (request_id, attempt, ts): a unique index on a partitioned
  table must contain the partition key, and both databases keep the same schema. Idempotency is
  unchanged in practice: a retried or replayed attempt carries its original ``ts``, so it hits the
  same key. The index's (request_id) prefix still serves lookups by request id.
- ``ix_request_log_session_id`` (session_id) becomes ``ix_request_log_session_ts`` (session_id,
  ts): the drill-down's "newest attempts of a session" is an index range read newest first,
  bounded by its LIMIT, instead of every row of the session sorted.

PostgreSQL only: ``request_log`` becomes ``PARTITION BY RANGE (ts)`` with one partition per UTC day
(created ahead by the writer: see :mod:`db.partitions`), so ``prune`` drops whole days. An existing
table is not copied: it is renamed ``request_log_p_legacy`` and attached as the first partition,
``FROM (MINVALUE) TO (<the day boundary after its newest row, or after today>)``. That costs one
validation scan of its rows and the two new indexes built over them (the other indexes are
reused as they are); the writer keeps filling it until that boundary, then day partitions take
over, and ``prune`` deletes its old rows in short batches until the whole of it is past retention
and it is dropped like any other partition. An empty table is simply replaced. The id sequence is
re-owned by the new table (dropping the legacy partition must not drop the sequence). No statement
timeout applies inside this migration (a populated table's index builds can take minutes); the lock
timeout still does, so a migration that cannot get the table fails and is retried.
"""

import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DAY_S = 86_400
LEGACY = "request_log_p_legacy"
# The 0011 indexes other than the two replaced here, as PostgreSQL DDL on the parent; each one finds
# its twin on the legacy table and attaches it instead of building it again.
_KEPT = {
    "ix_request_log_ts": "(ts)",
    "ix_request_log_substituted_ts": "(ts) WHERE substituted IS true",
    "ix_request_log_failed_ts": "(ts) WHERE status != 'ok'",
}
_NEW = {
    "ux_request_log_request_attempt_ts": "UNIQUE:(request_id, attempt, ts)",
    "ix_request_log_session_ts": "(session_id, ts)",
}


def _sqlite_upgrade() -> None:
    op.drop_index("ux_request_log_request_attempt", table_name="request_log")
    op.create_index("ux_request_log_request_attempt_ts", "request_log", ["request_id", "attempt", "ts"], unique=True)
    op.drop_index("ix_request_log_session_id", table_name="request_log")
    op.create_index("ix_request_log_session_ts", "request_log", ["session_id", "ts"])


def _create_index(conn, name: str, spec: str) -> None:
    unique = spec.startswith("UNIQUE:")
    body = spec.removeprefix("UNIQUE:")
    conn.exec_driver_sql(f"CREATE {'UNIQUE ' if unique else ''}INDEX {name} ON request_log {body}")


def _pg_upgrade() -> None:
    conn = op.get_bind()
    conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
    seq = conn.execute(sa.text("SELECT pg_get_serial_sequence('request_log', 'id')")).scalar_one()
    conn.exec_driver_sql(f"ALTER TABLE request_log RENAME TO {LEGACY}")
    conn.exec_driver_sql(f"ALTER INDEX request_log_pkey RENAME TO {LEGACY}_pkey")
    for name in (*_KEPT, "ux_request_log_request_attempt", "ix_request_log_session_id"):
        conn.exec_driver_sql(f"ALTER INDEX {name} RENAME TO {LEGACY}_{name.removeprefix('ix_request_log_')}")
    conn.exec_driver_sql(
        f"CREATE TABLE request_log (LIKE {LEGACY} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (ts)"
    )
    conn.exec_driver_sql(f"ALTER SEQUENCE {seq} OWNED BY request_log.id")
    newest = conn.execute(sa.text(f"SELECT max(ts) FROM {LEGACY}")).scalar()
    if newest is None:
        conn.exec_driver_sql(f"DROP TABLE {LEGACY}")
    else:
        # Replaced by the parent's new indexes below (their legacy copies are built by them).
        conn.exec_driver_sql(f"DROP INDEX {LEGACY}_ux_request_log_request_attempt")
        conn.exec_driver_sql(f"DROP INDEX {LEGACY}_session_id")
        upper = (int(max(float(newest), time.time()) // DAY_S) + 1) * DAY_S
        conn.exec_driver_sql(
            f"ALTER TABLE request_log ATTACH PARTITION {LEGACY} FOR VALUES FROM (MINVALUE) TO ({upper})"
        )
    for name, spec in {**_KEPT, **_NEW}.items():
        _create_index(conn, name, spec)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _pg_upgrade()
    else:
        _sqlite_upgrade()


def _pg_downgrade() -> None:
    # Back to one plain table: the rows are copied (a downgrade is rare; an upgrade never copies).
    conn = op.get_bind()
    conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
    seq = conn.execute(sa.text("SELECT pg_get_serial_sequence('request_log', 'id')")).scalar_one()
    conn.exec_driver_sql("CREATE TABLE request_log_flat (LIKE request_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    conn.exec_driver_sql("INSERT INTO request_log_flat SELECT * FROM request_log")
    conn.exec_driver_sql(f"ALTER SEQUENCE {seq} OWNED BY request_log_flat.id")
    conn.exec_driver_sql("DROP TABLE request_log")
    conn.exec_driver_sql("ALTER TABLE request_log_flat RENAME TO request_log")
    conn.exec_driver_sql("ALTER TABLE request_log ADD CONSTRAINT request_log_pkey PRIMARY KEY (id)")
    for name, spec in _KEPT.items():
        _create_index(conn, name, spec)
    _create_index(conn, "ux_request_log_request_attempt", "UNIQUE:(request_id, attempt)")
    _create_index(conn, "ix_request_log_session_id", "(session_id)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _pg_downgrade()
        return
    op.drop_index("ix_request_log_session_ts", table_name="request_log")
    op.create_index("ix_request_log_session_id", "request_log", ["session_id"])
    op.drop_index("ux_request_log_request_attempt_ts", table_name="request_log")
    op.create_index("ux_request_log_request_attempt", "request_log", ["request_id", "attempt"], unique=True)
