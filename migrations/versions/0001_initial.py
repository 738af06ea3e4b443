"""The initial catalog: topics, partitions, brokers, blocks, block_runs, segments.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand and frozen: it spells its own types instead of importing tiered.catalog.models, so that later
model changes cannot rewrite history. tests/catalog/test_migrations.py checks that head matches the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BLOCK_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "topics",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("partitions", sa.Integer(), nullable=False),
        sa.Column("config_text", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.CheckConstraint("partitions >= 1", name=op.f("ck_topics_partitions_positive")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_topics")),
    )
    op.create_table(
        "partitions",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("leader_broker", sa.Integer(), nullable=True),
        sa.Column("leader_epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("first_available_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("hwmark_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("remote_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["topic"], ["topics.name"], name=op.f("fk_partitions_topic_topics"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("topic", "partition", name=op.f("pk_partitions")),
    )
    op.create_table(
        "brokers",
        sa.Column("broker_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("heartbeat_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("broker_id", name=op.f("pk_brokers")),
    )
    op.create_table(
        "blocks",
        sa.Column("block_id", BLOCK_ID, autoincrement=True, nullable=False),
        sa.Column("object_key", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("broker_id", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("committed_at", TIME, nullable=True),
        sa.Column("delete_after", TIME, nullable=True),
        sa.CheckConstraint("state IN ('pending', 'committed', 'deleting')", name=op.f("ck_blocks_state")),
        sa.PrimaryKeyConstraint("block_id", name=op.f("pk_blocks")),
        sa.UniqueConstraint("object_key", name=op.f("uq_blocks_object_key")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_blocks_state_delete_after"), "blocks", ["state", "delete_after"])
    op.create_index(op.f("ix_blocks_state_created_at"), "blocks", ["state", "created_at"])
    op.create_table(
        "block_runs",
        sa.Column("block_id", BLOCK_ID, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("length_bytes", sa.BigInteger(), nullable=False),
        sa.Column("messages", sa.Integer(), nullable=False),
        sa.Column("min_ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("max_ts_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("first_seq <= last_seq", name=op.f("ck_block_runs_seq_range")),
        sa.ForeignKeyConstraint(["block_id"], ["blocks.block_id"], name=op.f("fk_block_runs_block_id_blocks")),
        sa.PrimaryKeyConstraint("block_id", "position", name=op.f("pk_block_runs")),
    )
    op.create_index(
        "ix_block_runs_lookup",
        "block_runs",
        ["topic", "partition", "last_seq"],
        postgresql_include=["first_seq", "position", "length_bytes", "block_id"],
    )
    op.create_index(op.f("ix_block_runs_block_id"), "block_runs", ["block_id"])
    op.create_table(
        "segments",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("base_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("object_key", sa.Text(), nullable=False),
        sa.Column("index_object_key", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("index_size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("min_ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("max_ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("freeze_ts", TIME, nullable=False),
        sa.Column("leader_epoch", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.CheckConstraint(
            "state IN ('COPY_STARTED', 'COPY_FINISHED', 'DELETE_STARTED', 'DELETE_FINISHED')",
            name=op.f("ck_segments_state"),
        ),
        sa.CheckConstraint("base_seq <= last_seq", name=op.f("ck_segments_seq_range")),
        sa.PrimaryKeyConstraint("topic", "partition", "base_seq", name=op.f("pk_segments")),
        sa.UniqueConstraint("object_key", name=op.f("uq_segments_object_key")),
        sa.UniqueConstraint("index_object_key", name=op.f("uq_segments_index_object_key")),
    )
    finished = sa.text("state = 'COPY_FINISHED'")
    op.create_index(
        "ix_segments_lookup",
        "segments",
        ["topic", "partition", "last_seq"],
        postgresql_where=finished,
        sqlite_where=finished,
    )


def downgrade() -> None:
    for table in ("segments", "block_runs", "blocks", "brokers", "partitions", "topics"):
        op.drop_table(table)
