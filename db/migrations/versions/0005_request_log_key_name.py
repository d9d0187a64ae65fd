"""request_log.key_name: the gateway key that sent each request (spend per key)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
# 0004 (the telemetry journal) is written on another branch; the lead fixes the chain at merge.
# TEMPORARY on branch w2-serve: points at 0003 so this branch's tests run. Set it to "0004".
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.add_column(sa.Column("key_name", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("key_name")
