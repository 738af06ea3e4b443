"""A partial index on the remote segments being copied (state COPY_STARTED).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29

The cleanup of abandoned copies (tiered.tiering.segments.abandoned_copies) looks, once a grace period, for COPY_STARTED rows
older than the grace period among the partitions a broker leads. With this index one statement answers that for
every partition at once, reading only the rows of copies in flight or abandoned, instead of a page of segment rows
per led partition: the look costs what is being copied, not how many partitions exist. Written by hand and frozen,
like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    copy_started = sa.text("state = 'COPY_STARTED'")
    op.create_index(
        "ix_segments_copy_started",
        "segments",
        ["topic", "partition", "base_seq"],
        postgresql_where=copy_started,
        sqlite_where=copy_started,
    )


def downgrade() -> None:
    op.drop_index("ix_segments_copy_started", table_name="segments")
