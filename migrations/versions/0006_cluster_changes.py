"""A change counter for the cluster's coordinators: an idle cluster re-reads nothing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29

- `cluster_changes`: one row (id 1) whose `version` triggers bump, in the transaction that makes the change,
  whenever what a broker's coordinator decides from changes:
  partitions inserted or deleted; a partition's `leader_broker`, `leader_epoch` or `handover_to` changed; its
  `first_available_seq` moved once set (retention; the first commit's 0 -> first seq does not count); topics
  inserted, deleted or updated. A commit that only raises `hwmark_seq` does not fire it (the row trigger's WHEN is
  false), so the block path neither waits on the counter row nor pays for a function call.
  Each broker reads the counter with the members, one small statement per tick, and re-reads the assignments only
  when it moved (tiered.tiering.cluster.coordinator). The bump is inside the changing transaction, so a counter a broker has
  seen never hides a change committed before it.
- The same triggers on SQLite (row triggers only; WHEN as on PostgreSQL).
Written by hand and frozen, like the others.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The partition columns whose change a coordinator must see (the committed bounds are not among them).
_MOVED = ("OLD.leader_broker IS DISTINCT FROM NEW.leader_broker OR OLD.leader_epoch <> NEW.leader_epoch "
          "OR OLD.handover_to IS DISTINCT FROM NEW.handover_to "
          "OR (OLD.first_available_seq <> 0 AND OLD.first_available_seq <> NEW.first_available_seq)")
_SQLITE_MOVED = _MOVED.replace("IS DISTINCT FROM", "IS NOT")
# An upsert: a catalog whose tables were emptied (TRUNCATE) counts again from its next change.
_BUMP = ("INSERT INTO cluster_changes (id, version) VALUES (1, 1) "
         "ON CONFLICT (id) DO UPDATE SET version = cluster_changes.version + 1")

_PG_UP = [
    f"CREATE FUNCTION tiered_cluster_changed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {_BUMP}; RETURN NULL; "
    f"END $$",
    "CREATE TRIGGER partitions_added_or_removed AFTER INSERT OR DELETE ON partitions "
    "FOR EACH STATEMENT EXECUTE FUNCTION tiered_cluster_changed()",
    f"CREATE TRIGGER partitions_moved AFTER UPDATE ON partitions FOR EACH ROW WHEN ({_MOVED}) "
    f"EXECUTE FUNCTION tiered_cluster_changed()",
    "CREATE TRIGGER topics_changed AFTER INSERT OR UPDATE OR DELETE ON topics "
    "FOR EACH STATEMENT EXECUTE FUNCTION tiered_cluster_changed()",
]
_PG_DOWN = [
    "DROP TRIGGER topics_changed ON topics",
    "DROP TRIGGER partitions_moved ON partitions",
    "DROP TRIGGER partitions_added_or_removed ON partitions",
    "DROP FUNCTION tiered_cluster_changed()",
]
_SQLITE_UP = [
    f"CREATE TRIGGER partitions_added AFTER INSERT ON partitions BEGIN {_BUMP}; END",
    f"CREATE TRIGGER partitions_removed AFTER DELETE ON partitions BEGIN {_BUMP}; END",
    f"CREATE TRIGGER partitions_moved AFTER UPDATE ON partitions FOR EACH ROW WHEN {_SQLITE_MOVED} "
    f"BEGIN {_BUMP}; END",
    f"CREATE TRIGGER topics_added AFTER INSERT ON topics BEGIN {_BUMP}; END",
    f"CREATE TRIGGER topics_updated AFTER UPDATE ON topics BEGIN {_BUMP}; END",
    f"CREATE TRIGGER topics_removed AFTER DELETE ON topics BEGIN {_BUMP}; END",
]
_SQLITE_DOWN = [f"DROP TRIGGER {name}" for name in (
    "topics_removed", "topics_updated", "topics_added", "partitions_moved", "partitions_removed",
    "partitions_added")]


def upgrade() -> None:
    changes = op.create_table(
        "cluster_changes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.bulk_insert(changes, [{"id": 1, "version": 0}])
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in _PG_UP if postgresql else _SQLITE_UP:
        op.execute(statement)


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for statement in _PG_DOWN if postgresql else _SQLITE_DOWN:
        op.execute(statement)
    op.drop_table("cluster_changes")
