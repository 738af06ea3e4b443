"""Several brokers as one service: brokers' endpoints and leases, and handovers asked of a partition's leader.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

- brokers: `advertised` (the TANK endpoint clients are redirected to), `http_endpoint`, `incarnation` (a token per
  process: a second process under the same broker id takes the row over and fences the first) and
  `lease_expires_at` (by the catalog's clock; a broker past it is dead to the others and its partitions are taken
  over), and `process` (host:pid, by which a SQLite catalog, one host's, tells a live broker from a crashed one).
  Existing rows get empty endpoints and no lease: they are not live until their broker registers again.
- partitions: `handover_to`, the broker `tiered cluster rebalance` asks the leader to hand the partition over to.
Written by hand and frozen, like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("brokers") as batch:
        batch.add_column(sa.Column("advertised", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("http_endpoint", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("incarnation", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("lease_expires_at", TIME, nullable=True))
        batch.add_column(sa.Column("process", sa.Text(), server_default="", nullable=False))
    with op.batch_alter_table("partitions") as batch:
        batch.add_column(sa.Column("handover_to", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("partitions") as batch:
        batch.drop_column("handover_to")
    with op.batch_alter_table("brokers") as batch:
        batch.drop_column("process")
        batch.drop_column("lease_expires_at")
        batch.drop_column("incarnation")
        batch.drop_column("http_endpoint")
        batch.drop_column("advertised")
