"""A statement that moves many partitions bumps the change counter once, not once per row (PostgreSQL).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29

Migration 0006's row trigger `partitions_moved` bumps `cluster_changes` for every partition row whose leader, epoch,
handover or (set) first available seq changed. A claim of 2,048 partitions therefore updated the one counter row
2,048 times inside its transaction: about half of the claim's time in the catalog (85 against 43 us per partition at
102,400 partitions), and a failover's claims by several brokers queue on that row. The trigger now skips rows changed
in a transaction that set `tiered.changes_counted` to `on` (`set_config(..., true)`: transaction-local, so it also
holds through a transaction-mode pooler); such a transaction bumps the counter itself, once
(tiered.catalog.changes). Every other update fires as before, and a commit that only raises
`hwmark_seq` still fails the trigger's first conditions without evaluating the setting. SQLite keeps its row
triggers: one broker, no contention, and no transaction-local settings. Written by hand and frozen, like the others.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# As in 0006.
_MOVED = ("OLD.leader_broker IS DISTINCT FROM NEW.leader_broker OR OLD.leader_epoch <> NEW.leader_epoch "
          "OR OLD.handover_to IS DISTINCT FROM NEW.handover_to "
          "OR (OLD.first_available_seq <> 0 AND OLD.first_available_seq <> NEW.first_available_seq)")
_NOT_COUNTED = "current_setting('tiered.changes_counted', true) IS DISTINCT FROM 'on'"


def _trigger(when: str) -> str:
    return (f"CREATE TRIGGER partitions_moved AFTER UPDATE ON partitions FOR EACH ROW WHEN ({when}) "
            f"EXECUTE FUNCTION tiered_cluster_changed()")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER partitions_moved ON partitions")
    op.execute(_trigger(f"({_MOVED}) AND {_NOT_COUNTED}"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER partitions_moved ON partitions")
    op.execute(_trigger(_MOVED))
