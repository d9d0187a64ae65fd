"""rollups of failed attempts by error class and of substituted requests, per minute and per hour,
backfilled from the log

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

The monitor's error-class filter choices and its substitution figures read raw ``request_log`` rows
over the whole window, so their cost grew with the log. Four tables take them over, written by the
telemetry writer in the same transaction as the rows (see :mod:`db.requests`):

- ``request_error_rollup`` / ``request_error_rollup_1h``: failed attempts (``attempts``) and failed
  final attempts (``requests``) per (bucket, provider, model, requested_model, intent, source,
  error_class); ``error_class`` is ``''`` for a failure without one.
- ``request_substitution_rollup`` / ``request_substitution_rollup_1h``: final substituted requests
  with their prompt, cached and completion tokens and cost per (bucket, provider, model,
  requested_model, intent, source).

The request table's error-class filter gets a partial index of the failed rows on
(error_class, ts), so a page of one class's failures reads that class's rows newest first.

The backfill is one ``INSERT ... SELECT ... GROUP BY`` per table over the rows still in the log
(failed rows through the failed-rows partial index, substituted ones through theirs). Buckets whose
raw rows were already pruned stay empty: those windows show no error classes or substitutions, as
the raw reads did. No statement timeout applies inside this migration (a large log's backfill can
take minutes); the lock timeout still does.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = ("minute", "provider", "model", "requested_model", "intent", "source")
_LENGTHS = {"provider": 64, "model": 128, "requested_model": 128, "intent": 32, "source": 32}
ERROR_TABLES = {"request_error_rollup": 60, "request_error_rollup_1h": 3600}
SUBSTITUTION_TABLES = {"request_substitution_rollup": 60, "request_substitution_rollup_1h": 3600}


def _key_columns() -> list[sa.Column]:
    cols = [sa.Column("minute", sa.BigInteger(), primary_key=True)]
    cols += [sa.Column(name, sa.String(length), primary_key=True) for name, length in _LENGTHS.items()]
    return cols


def _bucket(span: int) -> str:
    # The writer's ``int(ts // span) * span``, in each database's spelling.
    if op.get_bind().dialect.name == "postgresql":
        return f"(floor(ts / {span}))::bigint * {span}"
    return f"CAST(ts / {span} AS INTEGER) * {span}"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
    for name in ERROR_TABLES:
        op.create_table(
            name,
            *_key_columns(),
            sa.Column("error_class", sa.String(64), primary_key=True),
            sa.Column("attempts", sa.BigInteger(), nullable=False),
            sa.Column("requests", sa.BigInteger(), nullable=False),
        )
    for name in SUBSTITUTION_TABLES:
        op.create_table(
            name,
            *_key_columns(),
            sa.Column("requests", sa.BigInteger(), nullable=False),
            sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
            sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
            sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
            sa.Column("cost_usd", sa.Float(), nullable=False),
        )
    op.create_index(
        "ix_request_log_failed_class_ts",
        "request_log",
        ["error_class", "ts"],
        sqlite_where=sa.text("status != 'ok'"),
        postgresql_where=sa.text("status != 'ok'"),
    )
    dims = ", ".join(_KEY[1:])
    for name, span in ERROR_TABLES.items():
        conn.exec_driver_sql(
            f"INSERT INTO {name} ({', '.join(_KEY)}, error_class, attempts, requests) "
            f"SELECT {_bucket(span)}, {dims}, COALESCE(error_class, ''), COUNT(*), "
            "SUM(CASE WHEN final THEN 1 ELSE 0 END) "
            "FROM request_log WHERE status != 'ok' GROUP BY 1, 2, 3, 4, 5, 6, 7"
        )
    substituted = "substituted IS true" if conn.dialect.name == "postgresql" else "substituted IS 1"
    for name, span in SUBSTITUTION_TABLES.items():
        conn.exec_driver_sql(
            f"INSERT INTO {name} ({', '.join(_KEY)}, requests, prompt_tokens, cached_tokens, "
            "completion_tokens, cost_usd) "
            f"SELECT {_bucket(span)}, {dims}, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), "
            "SUM(completion_tokens), SUM(cost_usd) "
            f"FROM request_log WHERE {substituted} AND final GROUP BY 1, 2, 3, 4, 5, 6"
        )


def downgrade() -> None:
    op.drop_index("ix_request_log_failed_class_ts", table_name="request_log")
    for name in (*SUBSTITUTION_TABLES, *ERROR_TABLES):
        op.drop_table(name)
