"""Wide blocks commit like narrow ones: block_runs without its foreign key to blocks (nor the key's index),
partitions pages half free.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

A block of 1,600 runs (one per partition it touches) made PostgreSQL run the foreign key's trigger 1,600 times in
its commit, each a probe and a KEY SHARE lock of the same block row the commit had just locked and marked
committed: about a third of the INSERT's time. What the key protected (a run naming a block row that does not
exist) the catalog's transitions already rule out: runs are inserted only by commit_block, in the transaction that
holds the block row's lock and moves it to `committed` (or by the rebuild, right after their block's row), and a
block row is deleted only from `deleting`, which it reaches only once no run references it, checked under the block
row's lock (tiered.catalog.blocks). `tiered catalog check` reports a run whose block row is missing or not
committed. The key's own index on block_runs.block_id goes too: every prune asks whether a block still has runs, and
the primary key (block_id, position) answers that by its first column; one index fewer to write per run.

The same commit rewrites the partitions row of each of its 1,600 partitions; on PostgreSQL each rewrite is a new row
version, and on full pages (fillfactor 100) most of them went to another page with a new primary key entry. With
fillfactor 50 the new version lands on its own page (a HOT update): the UPDATE took 4.3 ms instead of 7.2 (median,
bench.bench_scale_commit). Pages already written fill up as they are rewritten. SQLite has no such setting.
Written by hand and frozen, like the others.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

FOREIGN_KEY = "fk_block_runs_block_id_blocks"
RUNS_OF_A_BLOCK = "ix_block_runs_block_id"


def upgrade() -> None:
    with op.batch_alter_table("block_runs") as batch:
        batch.drop_constraint(FOREIGN_KEY, type_="foreignkey")
    op.drop_index(RUNS_OF_A_BLOCK, table_name="block_runs")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE partitions SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE partitions RESET (fillfactor)")
    op.create_index(RUNS_OF_A_BLOCK, "block_runs", ["block_id"])
    with op.batch_alter_table("block_runs") as batch:
        batch.create_foreign_key(FOREIGN_KEY, "blocks", ["block_id"], ["block_id"])
