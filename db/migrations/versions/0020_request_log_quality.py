"""request_log.refused, tool_json_bad, schema_bad, chunk_gap_ms: what the canary analysis judges an
answer by, recorded per attempt (rows written before read as not refused, no broken tool JSON, not
judged, no stream timing)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.add_column(sa.Column("refused", sa.Boolean(), nullable=False, server_default=sa.text("false")))
        batch.add_column(sa.Column("tool_json_bad", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("schema_bad", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("chunk_gap_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("chunk_gap_ms")
        batch.drop_column("schema_bad")
        batch.drop_column("tool_json_bad")
        batch.drop_column("refused")
