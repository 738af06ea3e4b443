"""A change version per partition: a broker's look reads the partitions changed since its last look, not all of them.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29

- `partitions.change_version`: the value of the `cluster_changes` counter taken by the transaction that last changed
  what a coordinator decides from (the row inserted; its leader, epoch or handover; its first available seq moved
  once set). `ix_partitions_change_version` makes "the rows changed since version V" a range scan of what changed
  (tiered.catalog.cluster.changed_since). Existing rows take the counter's current value.
- Versions are taken under the counter row's lock (an UPDATE of it, held to the commit): a transaction that took
  version v commits before any transaction can take v + 1, so versions are in commit order, and a reader that has
  seen the counter at V has seen every row of a version <= V (tiered.catalog.changes).
- The writers of many rows (a claim, a handover's assignment, a topic's creation) take one version and write it on
  their rows themselves (tiered.catalog.changes.take_version). Any other change (retention moving a first available
  seq, `tiered cluster rebalance`, the rebuild, an insert without a version) is versioned by a row trigger, which
  fires only when the statement left `change_version` as it was (so it skips the writers above; migration 0010's
  transaction-local setting is no longer needed). On PostgreSQL a BEFORE trigger sets the row's version; on SQLite
  an AFTER trigger bumps the counter and writes it on the row (one broker: versions are in commit order anyway).
Written by hand and frozen, like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# As in 0006.
_MOVED = ("OLD.leader_broker IS DISTINCT FROM NEW.leader_broker OR OLD.leader_epoch <> NEW.leader_epoch "
          "OR OLD.handover_to IS DISTINCT FROM NEW.handover_to "
          "OR (OLD.first_available_seq <> 0 AND OLD.first_available_seq <> NEW.first_available_seq)")
_SQLITE_MOVED = _MOVED.replace("IS DISTINCT FROM", "IS NOT")
_BUMP = ("INSERT INTO cluster_changes (id, version) VALUES (1, 1) "
         "ON CONFLICT (id) DO UPDATE SET version = cluster_changes.version + 1")
_UNVERSIONED = "NEW.change_version = OLD.change_version"
_CURRENT = "(SELECT version FROM cluster_changes WHERE id = 1)"

_PG_UP = [
    f"CREATE FUNCTION tiered_partition_versioned() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    f"{_BUMP} RETURNING version INTO NEW.change_version; RETURN NEW; END $$",
    "DROP TRIGGER partitions_moved ON partitions",
    f"CREATE TRIGGER partitions_moved BEFORE UPDATE ON partitions FOR EACH ROW "
    f"WHEN (({_MOVED}) AND {_UNVERSIONED}) EXECUTE FUNCTION tiered_partition_versioned()",
    "CREATE TRIGGER partitions_versioned BEFORE INSERT ON partitions FOR EACH ROW "
    "WHEN (NEW.change_version = 0) EXECUTE FUNCTION tiered_partition_versioned()",
]
# 0010's trigger again.
_PG_DOWN = [
    "DROP TRIGGER partitions_versioned ON partitions",
    "DROP TRIGGER partitions_moved ON partitions",
    "DROP FUNCTION tiered_partition_versioned()",
    f"CREATE TRIGGER partitions_moved AFTER UPDATE ON partitions FOR EACH ROW WHEN (({_MOVED}) AND "
    f"current_setting('tiered.changes_counted', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION tiered_cluster_changed()",
]
_SQLITE_SET = (f'UPDATE partitions SET change_version = {_CURRENT} '
               f'WHERE topic = NEW.topic AND "partition" = NEW."partition"')
_SQLITE_UP = [
    "DROP TRIGGER partitions_moved",
    "DROP TRIGGER partitions_added",
    f"CREATE TRIGGER partitions_moved AFTER UPDATE ON partitions FOR EACH ROW "
    f"WHEN ({_SQLITE_MOVED}) AND {_UNVERSIONED} BEGIN {_BUMP}; {_SQLITE_SET}; END",
    f"CREATE TRIGGER partitions_added AFTER INSERT ON partitions FOR EACH ROW WHEN NEW.change_version = 0 "
    f"BEGIN {_BUMP}; {_SQLITE_SET}; END",
]
# 0006's triggers again.
_SQLITE_DOWN = [
    "DROP TRIGGER partitions_added",
    "DROP TRIGGER partitions_moved",
    f"CREATE TRIGGER partitions_added AFTER INSERT ON partitions BEGIN {_BUMP}; END",
    f"CREATE TRIGGER partitions_moved AFTER UPDATE ON partitions FOR EACH ROW WHEN {_SQLITE_MOVED} "
    f"BEGIN {_BUMP}; END",
]


def upgrade() -> None:
    op.add_column("partitions", sa.Column("change_version", sa.BigInteger(), server_default="0", nullable=False))
    # No trigger fires on this update (nothing a decision depends on moves): every row starts at the current count.
    op.execute(f"UPDATE partitions SET change_version = COALESCE({_CURRENT}, 0)")
    op.create_index("ix_partitions_change_version", "partitions", ["change_version"])
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in _PG_UP if postgresql else _SQLITE_UP:
        op.execute(statement)


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in _PG_DOWN if postgresql else _SQLITE_DOWN:
        op.execute(statement)
    op.drop_index("ix_partitions_change_version", table_name="partitions")
    op.drop_column("partitions", "change_version")
