"""ops_event (fault-injection changes, circuit-breaker transitions) and drill-down indexes

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ops_event",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.String(length=500), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_ops_event_ts", "ops_event", ["ts"])
    # The drill-down searches by session id; the monitor sums substituted requests of a window
    # (a partial index: substitutions are rare, so it stays small).
    op.create_index("ix_request_log_session_id", "request_log", ["session_id"])
    op.create_index(
        "ix_request_log_substituted_ts",
        "request_log",
        ["ts"],
        sqlite_where=sa.text("substituted IS 1"),
        postgresql_where=sa.text("substituted IS true"),
    )


def downgrade() -> None:
    op.drop_index("ix_request_log_substituted_ts", table_name="request_log")
    op.drop_index("ix_request_log_session_id", table_name="request_log")
    op.drop_index("ix_ops_event_ts", table_name="ops_event")
    op.drop_table("ops_event")
