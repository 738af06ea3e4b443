"""The cost meter's table: object store requests and bytes per broker, hour, topic and measure.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29

Each broker adds what its meter counted (tiered.tiering.objects.meter) to its rows of the hour, once a minute
(tiered.catalog.usage.add_usage); `tiered cost` sums every broker's rows over a window. The primary key starts with
the hour, so a window is one range of it. Written by hand and frozen, like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "object_usage",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("broker_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("measure", sa.Text(), nullable=False),
        sa.Column("amount", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "broker_id", "topic", "measure", name="pk_object_usage"),
    )


def downgrade() -> None:
    op.drop_table("object_usage")
