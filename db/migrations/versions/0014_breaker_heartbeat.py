"""breaker_heartbeat: each gateway process's circuit breakers, reported every few seconds

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

The incident banner read breaker state from the merged transitions of every process
(``ops_event``), so a process that exited with its breaker open was never followed by a "closed"
and its incident never ended. Each process now rewrites its rows here on a timer (and at once on a
transition); only rows beaten recently count, and a clean exit deletes its own.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "breaker_heartbeat",
        sa.Column("process", sa.String(64), primary_key=True),
        sa.Column("provider", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("since", sa.Float(), nullable=True),
        sa.Column("beat_at", sa.Float(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
    )
    op.create_index("ix_breaker_heartbeat_beat_at", "breaker_heartbeat", ["beat_at"])


def downgrade() -> None:
    op.drop_index("ix_breaker_heartbeat_beat_at", table_name="breaker_heartbeat")
    op.drop_table("breaker_heartbeat")
