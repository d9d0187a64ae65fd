"""request_log.adjusted_params: what a provider's drop_params / rename_params changed in the attempt

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.add_column(sa.Column("adjusted_params", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("adjusted_params")
