"""dashboard sessions: dashboard_user.session_epoch (revokes an account's session tokens) and
dashboard_secret (the signing key generated once when none is configured)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("dashboard_user") as batch:
        batch.add_column(sa.Column("session_epoch", sa.Integer(), nullable=False, server_default=sa.text("0")))
    op.create_table(
        "dashboard_secret",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("dashboard_secret")
    with op.batch_alter_table("dashboard_user") as batch:
        batch.drop_column("session_epoch")
