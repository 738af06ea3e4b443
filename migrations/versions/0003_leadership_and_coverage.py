"""Leadership history and exact coverage: partition_epochs, and from_seq on block runs and remote segments.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

- `partition_epochs`: one row per leadership claim (epoch, broker, disk, first seq of the epoch). A broker reopening
  its disk learns from it whether another volume led the partition since, and truncates its local records to the
  last seq its own epochs committed. Existing partitions get one row for their current epoch, with start_seq =
  high-water mark + 1 and an unknown disk ('').
- `from_seq` on block_runs and segments: the first seq a location answers for (a jump in seqs before its first
  record belongs to it). Existing rows answer from their first seq. `leader_epoch` on block_runs: the epoch its
  commit checked (0 for existing rows). The fetch lookup index carries from_seq and the timestamp bounds
  (PostgreSQL INCLUDE), so every run lookup stays index-only.
Written by hand and frozen, like 0001 and 0002 (its own types, no import of the models).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "partition_epochs",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("leader_epoch", sa.BigInteger(), nullable=False),
        sa.Column("broker_id", sa.Integer(), nullable=False),
        sa.Column("disk_id", sa.Text(), nullable=False),
        sa.Column("start_seq", sa.BigInteger(), nullable=False),
        sa.Column("claimed_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(["topic", "partition"], ["partitions.topic", "partitions.partition"],
                                name=op.f("fk_partition_epochs_topic_partition_partitions"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("topic", "partition", "leader_epoch", name=op.f("pk_partition_epochs")),
    )
    op.execute(
        "INSERT INTO partition_epochs (topic, partition, leader_epoch, broker_id, disk_id, start_seq, claimed_at) "
        "SELECT topic, partition, leader_epoch, leader_broker, '', hwmark_seq + 1, CURRENT_TIMESTAMP "
        "FROM partitions WHERE leader_broker IS NOT NULL"
    )
    with op.batch_alter_table("block_runs") as batch:
        batch.add_column(sa.Column("from_seq", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("leader_epoch", sa.BigInteger(), server_default="0", nullable=False))
    op.execute("UPDATE block_runs SET from_seq = first_seq")
    with op.batch_alter_table("block_runs") as batch:
        batch.alter_column("from_seq", existing_type=sa.BigInteger(), nullable=False)
        batch.create_check_constraint("from_seq", "from_seq <= first_seq")
    op.drop_index("ix_block_runs_lookup", table_name="block_runs")
    op.create_index("ix_block_runs_lookup", "block_runs", ["topic", "partition", "last_seq"],
                    postgresql_include=["first_seq", "position", "length_bytes", "block_id", "from_seq", "min_ts_ms",
                                        "max_ts_ms"])
    with op.batch_alter_table("segments") as batch:
        batch.add_column(sa.Column("from_seq", sa.BigInteger(), nullable=True))
    op.execute("UPDATE segments SET from_seq = base_seq")
    with op.batch_alter_table("segments") as batch:
        batch.alter_column("from_seq", existing_type=sa.BigInteger(), nullable=False)
        batch.create_check_constraint("from_seq", "from_seq <= base_seq")


def downgrade() -> None:
    with op.batch_alter_table("segments") as batch:
        batch.drop_constraint("from_seq", type_="check")
        batch.drop_column("from_seq")
    op.drop_index("ix_block_runs_lookup", table_name="block_runs")
    op.create_index("ix_block_runs_lookup", "block_runs", ["topic", "partition", "last_seq"],
                    postgresql_include=["first_seq", "position", "length_bytes", "block_id"])
    with op.batch_alter_table("block_runs") as batch:
        batch.drop_constraint("from_seq", type_="check")
        batch.drop_column("leader_epoch")
        batch.drop_column("from_seq")
    op.drop_table("partition_epochs")
