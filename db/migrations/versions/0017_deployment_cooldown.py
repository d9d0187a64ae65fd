"""deployment_cooldown: the route deployments cooling down in each gateway process

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

A route deployment's cooldown (``allowed_fails`` failures in a row, then ``cooldown_s`` out) lives
in the process that saw the failures. Each process now reports its cooling deployments with its
breaker heartbeat (one row per deployment, rewritten every beat); a reader counts only rows beaten
recently, so a process that stopped reporting no longer counts.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deployment_cooldown",
        sa.Column("process", sa.String(64), primary_key=True),
        sa.Column("deployment", sa.String(200), primary_key=True),
        sa.Column("until", sa.Float(), nullable=False),
        sa.Column("beat_at", sa.Float(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
    )
    op.create_index("ix_deployment_cooldown_beat_at", "deployment_cooldown", ["beat_at"])


def downgrade() -> None:
    op.drop_index("ix_deployment_cooldown_beat_at", table_name="deployment_cooldown")
    op.drop_table("deployment_cooldown")
