"""request_log: unique (request_id, attempt) so inserts are idempotent

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Rows written twice before this revision (a batch retried after its commit) are removed
first, keeping the lowest id of each (request_id, attempt), and their counts are taken back out of
the three rollup tables, which had counted every copy. The composite unique index replaces the
single-column request_id index (its prefix serves the same lookups).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _remove_duplicates(conn) -> None:
    from core.records import FIELD_NAMES, AttemptRecord
    from db.models import ROLLUP_TABLES
    from db.requests import rollup_deltas

    dup_ids = sa.text(
        "SELECT id FROM request_log WHERE id NOT IN (SELECT MIN(id) FROM request_log GROUP BY request_id, attempt)"
    )
    ids = [row[0] for row in conn.execute(dup_ids)]
    if not ids:
        return
    # Only the columns this revision has: fields added by later migrations keep their defaults.
    present = {c["name"] for c in sa.inspect(conn).get_columns("request_log")}
    names = [f for f in FIELD_NAMES if f in present]
    cols = ", ".join(names)
    records = []
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        rows = conn.execute(
            sa.text(f"SELECT {cols} FROM request_log WHERE id IN :ids").bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": chunk},
        )
        for row in rows:
            values = dict(zip(names, row, strict=True))
            for flag in ("fallback", "final", "substituted", "stream"):
                values[flag] = bool(values[flag])
            records.append(AttemptRecord(**values))
    # Take each extra copy's contribution back out of the rollups (same folding as the writer).
    for span, model in ROLLUP_TABLES.items():
        table = model.__table__
        key_cols = ["minute", "provider", "model", "intent", "source", "side"]
        for delta in rollup_deltas(records, span):
            counters = {c: v for c, v in delta.items() if c not in key_cols and v}
            if not counters:
                continue
            stmt = (
                table.update()
                .where(*(table.c[k] == delta[k] for k in key_cols))
                .values({c: table.c[c] - v for c, v in counters.items()})
            )
            conn.execute(stmt)
    for i in range(0, len(ids), 500):
        conn.execute(
            sa.text("DELETE FROM request_log WHERE id IN :ids").bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": ids[i : i + 500]},
        )


def upgrade() -> None:
    _remove_duplicates(op.get_bind())
    with op.batch_alter_table("request_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_request_log_request_id"))
        batch_op.create_index("ux_request_log_request_attempt", ["request_id", "attempt"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("request_log", schema=None) as batch_op:
        batch_op.drop_index("ux_request_log_request_attempt")
        batch_op.create_index(batch_op.f("ix_request_log_request_id"), ["request_id"], unique=False)
