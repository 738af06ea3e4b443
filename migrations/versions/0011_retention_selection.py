"""Indexes for remote retention's selection: readable segments by (topic, freeze_ts), partitions by
(topic, remote_bytes).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29

A remote retention pass read, for every led partition with a retention configured, its oldest readable segments
(and its first available seq, and its oldest block run): about four statements per partition, every 60 s, whether
anything expired or not (769 s for 100,000 partitions). It now asks first, in one statement across the led topics
(tiered.catalog.segments.partitions_due_for_retention), which partitions have a readable segment frozen before their
topic's cutoff (`ix_segments_expiry`, partial: readable segments only) or more remote bytes than their topic's limit
(`ix_partitions_remote_bytes`): range scans of what is past its limit, so the look costs what expires, not how many
partitions exist. Written by hand and frozen, like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    readable = sa.text("state = 'COPY_FINISHED'")
    op.create_index(
        "ix_segments_expiry",
        "segments",
        ["topic", "freeze_ts"],
        postgresql_where=readable,
        sqlite_where=readable,
    )
    op.create_index("ix_partitions_remote_bytes", "partitions", ["topic", "remote_bytes"])


def downgrade() -> None:
    op.drop_index("ix_partitions_remote_bytes", table_name="partitions")
    op.drop_index("ix_segments_expiry", table_name="segments")
