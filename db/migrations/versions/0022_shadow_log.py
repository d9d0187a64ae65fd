"""shadow_log: the answers a rollout's shadow phase got from the candidate for mirrored copies of
the baseline's requests (one row per mirrored request, keyed by the baseline request it copies).
Kept apart from request_log so that no figure of real traffic (rollups, spend, the Monitor) can
count them.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "shadow_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_class", sa.String(64), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("tool_calls", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cost_usd", sa.Float(), nullable=False, server_default="0"),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("refused", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("tool_json_bad", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("schema_bad", sa.Boolean(), nullable=True),
    )
    op.create_index("ix_shadow_log_rollout_id", "shadow_log", ["rollout_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_shadow_log_rollout_id", table_name="shadow_log")
    op.drop_table("shadow_log")
