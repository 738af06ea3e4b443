"""A committed block's runs in its own row until they are expanded into block_runs.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

A commit of a block touching 1,600 partitions spent most of its time writing 1,600 `block_runs` rows: a heap row and
an entry of `ix_block_runs_lookup` each, in 1,600 different leaf pages (docs/benchmarks.md, "Third round"). The
commit now writes the runs packed in one value of the block's own row, `blocks.runs_pending`, and an expansion after
the acknowledgements inserts the `block_runs` rows and clears it in one transaction (tiered.catalog.blocks). Readers
look in the unexpanded blocks when block_runs and the segments do not answer. `ix_blocks_runs_pending` (partial: only
the unexpanded blocks, a handful) makes finding them, and the sweep of those a crash left, an index scan.
Existing blocks hold their runs in block_runs already: NULL, every location kept. On PostgreSQL the column is stored
EXTERNAL (out of line, not compressed). Written by hand and frozen.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_PENDING = sa.text("runs_pending IS NOT NULL")


def upgrade() -> None:
    op.add_column("blocks", sa.Column("runs_pending", sa.LargeBinary(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        # Stored out of line uncompressed: the packed runs (76 bytes a run) are written once and read whole, and
        # compressing them cost the commit of 1,600 runs about 0.4 ms of its 1.3 ms mark (docs/benchmarks.md).
        op.execute("ALTER TABLE blocks ALTER COLUMN runs_pending SET STORAGE EXTERNAL")
    op.create_index("ix_blocks_runs_pending", "blocks", ["committed_at"], postgresql_where=_PENDING,
                    sqlite_where=_PENDING)


def downgrade() -> None:
    # Expanding first would need the code's decoder: a downgrade with unexpanded blocks refuses instead.
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT count(*) FROM blocks WHERE runs_pending IS NOT NULL")).scalar():
        raise RuntimeError("blocks with unexpanded runs: start a broker of this version to expand them first")
    op.drop_index("ix_blocks_runs_pending", table_name="blocks")
    with op.batch_alter_table("blocks") as batch:
        batch.drop_column("runs_pending")
