"""request_log: which OpenAI API a request used, its finish reason, tool calls, reasoning tokens

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

The gateway proxies chat completions, the Responses API, embeddings and legacy completions. Each
attempt row records its ``api`` (server default ``'chat'``: every row written before this revision
was a chat completion), the answer's ``finish_reason``, the number of ``tool_calls`` in the answer
and its ``reasoning_tokens`` (already included in ``completion_tokens``).

The three rollup tables gain the sums ``reasoning_tokens`` and ``tool_calls`` and the final-request
counts of the non-chat APIs (``responses_requests``, ``embeddings_requests``,
``completions_requests``; chat is ``requests`` minus these). All default to 0, which is exact for the
buckets written before this revision, so nothing is backfilled.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLUP_TABLES = ("request_rollup", "request_rollup_5m", "request_rollup_1h")
ROLLUP_COLUMNS = ("reasoning_tokens", "tool_calls", "responses_requests", "embeddings_requests", "completions_requests")


def upgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.add_column(sa.Column("api", sa.String(length=16), server_default="chat", nullable=False))
        batch.add_column(sa.Column("finish_reason", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("tool_calls", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("reasoning_tokens", sa.Integer(), server_default="0", nullable=False))
    for table in ROLLUP_TABLES:
        with op.batch_alter_table(table) as batch:
            for name in ROLLUP_COLUMNS:
                batch.add_column(sa.Column(name, sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:
    for table in ROLLUP_TABLES:
        with op.batch_alter_table(table) as batch:
            for name in reversed(ROLLUP_COLUMNS):
                batch.drop_column(name)
    with op.batch_alter_table("request_log") as batch:
        for name in ("reasoning_tokens", "tool_calls", "finish_reason", "api"):
            batch.drop_column(name)
