"""gateway keys, rate-limit windows, spend ledger and reservations

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "gateway_key",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("key_prefix", sa.String(length=16), nullable=False),
        sa.Column("models", sa.Text(), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.BigInteger(), nullable=True),
        sa.Column("budget_micro_usd", sa.BigInteger(), nullable=True),
        sa.Column("budget_period", sa.String(length=8), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("key_hash"),
    )
    op.create_table(
        "gateway_key_window",
        sa.Column("key_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "window_start"),
    )
    op.create_table(
        "gateway_key_spend",
        sa.Column("key_id", sa.BigInteger(), nullable=False),
        sa.Column("period_start", sa.BigInteger(), nullable=False),
        sa.Column("spent_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("reserved_micro_usd", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "period_start"),
    )
    op.create_table(
        "gateway_key_reservation",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("key_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("period_start", sa.BigInteger(), nullable=True),
        sa.Column("est_tokens", sa.BigInteger(), nullable=False),
        sa.Column("est_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("settled_at", sa.Float(), nullable=True),
        sa.Column("actual_tokens", sa.BigInteger(), nullable=True),
        sa.Column("actual_micro_usd", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("gateway_key_reservation", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gateway_key_reservation_key_id"), ["key_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_gateway_key_reservation_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gateway_key_reservation", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gateway_key_reservation_created_at"))
        batch_op.drop_index(batch_op.f("ix_gateway_key_reservation_key_id"))
    op.drop_table("gateway_key_reservation")
    op.drop_table("gateway_key_spend")
    op.drop_table("gateway_key_window")
    op.drop_table("gateway_key")
