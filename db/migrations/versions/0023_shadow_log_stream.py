"""shadow_log: whether the copy was streamed (as the baseline request it copies was) and the
largest gap between its chunks, so the shadow phase compares time to first token and chunk gaps
on streamed pairs; rows written before read as not streamed

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("shadow_log") as batch:
        batch.add_column(sa.Column("stream", sa.Boolean(), nullable=False, server_default=sa.text("false")))
        batch.add_column(sa.Column("chunk_gap_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("shadow_log") as batch:
        batch.drop_column("chunk_gap_ms")
        batch.drop_column("stream")
