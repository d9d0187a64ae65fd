"""sim_fault: answer-quality faults of a simulated provider (refusals, truncations, empty answers,
broken tool JSON, schema violations, verbosity, time to first token); rows written before read as
none of them

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RATES = ("refusal_rate", "truncation_rate", "empty_rate", "tool_json_break_rate", "schema_violation_rate")
MULTIPLIERS = ("verbosity_multiplier", "ttft_multiplier")


def upgrade() -> None:
    with op.batch_alter_table("sim_fault") as batch:
        for name in RATES:
            batch.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0"))
        for name in MULTIPLIERS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("sim_fault") as batch:
        for name in reversed((*RATES, *MULTIPLIERS)):
            batch.drop_column(name)
