"""A partial index on the remote segments mid-deletion (state DELETE_STARTED).

Revision ID: 0002
Revises: 0001
Create Date: 2025-06-01

Remote retention starts each pass by finishing the deletions an interrupted pass left in DELETE_STARTED, in
base_seq order; without this index that lookup scans every segment of the partition ever deleted. Written by hand
and frozen, like 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    delete_started = sa.text("state = 'DELETE_STARTED'")
    op.create_index(
        "ix_segments_delete_started",
        "segments",
        ["topic", "partition", "base_seq"],
        postgresql_where=delete_started,
        sqlite_where=delete_started,
    )


def downgrade() -> None:
    op.drop_index("ix_segments_delete_started", table_name="segments")
