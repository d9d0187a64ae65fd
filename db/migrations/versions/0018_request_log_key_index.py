"""request_log: a partial index on (key_name, ts, id) of the rows a gateway key sent, for the
request table's key filter

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

The table's gateway-key filter is carried by no rollup, so its count and its pages read raw rows.
Along the ``ts`` index alone they walk every row of the window to find one key's: the count of an
hour grew with the log, and a page of a key that sent little walked the whole window. With this
index both read only the key's rows of the window, newest first (``id`` last, so a keyset page of
``(ts, id)`` comes in index order on PostgreSQL too; SQLite appends its rowid to every index).
Rows without a key (the dashboard's and the command line's) are left out: most rows, no use here.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")  # a large log's index takes its time
    op.create_index(
        "ix_request_log_key_ts",
        "request_log",
        ["key_name", "ts", "id"],
        sqlite_where=sa.text("key_name IS NOT NULL"),
        postgresql_where=sa.text("key_name IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_request_log_key_ts", table_name="request_log")
