"""rollout: progressive-delivery plans and where each stands (steps, bake time, analysis settings,
state, current step and its start); rollout_lease: the one controller allowed to act, with an
expiry and a fencing token every rollout write checks

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

``active_scope`` equals ``scope`` while a rollout is running or paused and is NULL once it ended;
its unique constraint keeps one active rollout per canary scope (NULLs never collide).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(140), nullable=False),
        sa.Column("active_scope", sa.String(140), nullable=True),
        sa.Column("candidate", sa.String(64), nullable=False),
        sa.Column("route", sa.String(128), nullable=True),
        sa.Column("steps", sa.String(400), nullable=False),
        sa.Column("bake_s", sa.Float(), nullable=False),
        sa.Column("min_samples", sa.Integer(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("shadow_share", sa.Float(), nullable=True),
        sa.Column("shadow_budget_usd", sa.Float(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("step_started_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("started_by", sa.String(128), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("last_reason", sa.String(500), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.UniqueConstraint("active_scope", name="uq_rollout_active_scope"),
    )
    op.create_index("ix_rollout_started_at", "rollout", ["started_at"])
    op.create_table(
        "rollout_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rollout_lease")
    op.drop_index("ix_rollout_started_at", table_name="rollout")
    op.drop_table("rollout")
