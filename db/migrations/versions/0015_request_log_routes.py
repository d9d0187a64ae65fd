"""request_log.route, deployment, route_why: which [routes] entry and deployment an attempt went to,
and why its strategy chose it (null on rows of the two-sided routing and on rows written before);
canary_setting.scope and canary_audit.scope: a canary ratio per route beside the global one (the
existing row and its audit are "global")

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.add_column(sa.Column("route", sa.String(128), nullable=True))
        batch.add_column(sa.Column("deployment", sa.String(200), nullable=True))
        batch.add_column(sa.Column("route_why", sa.String(200), nullable=True))
    with op.batch_alter_table("canary_setting") as batch:
        batch.add_column(sa.Column("scope", sa.String(140), nullable=False, server_default="global"))
        batch.create_unique_constraint("uq_canary_setting_scope", ["scope"])
    with op.batch_alter_table("canary_audit") as batch:
        batch.add_column(sa.Column("scope", sa.String(140), nullable=False, server_default="global"))


def downgrade() -> None:
    with op.batch_alter_table("canary_audit") as batch:
        batch.drop_column("scope")
    with op.batch_alter_table("canary_setting") as batch:
        batch.drop_constraint("uq_canary_setting_scope", type_="unique")
        batch.drop_column("scope")
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("route_why")
        batch.drop_column("deployment")
        batch.drop_column("route")
