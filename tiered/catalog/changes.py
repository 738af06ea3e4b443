"""The change counter the coordinators look at (migrations 0006 and 0010): a statement that moves many partitions
counts once.

Migration 0006's row trigger bumps `cluster_changes` for every partition row whose leader, epoch, handover or (set)
first available seq changes; migration 0010 lets it skip the rows of a transaction that said it counts its changes
itself (`skip_row_counts`, a transaction-local setting), which then bumps the counter once (`count_change`). A claim
or a handover's assignment of thousands of partitions thus updates the counter row once, not once per partition
(which was half of a claim's time in PostgreSQL, and made the claims of several brokers queue on that row). The bump
is in the changing transaction, so a counter a broker has seen never hides the change. SQLite keeps its row
triggers (one broker, no contention, no transaction-local settings): both calls do nothing there.
"""

from __future__ import annotations

from sqlalchemy import Connection

_BUMP = ("INSERT INTO cluster_changes (id, version) VALUES (1, 1) "
         "ON CONFLICT (id) DO UPDATE SET version = cluster_changes.version + 1")
_SKIP_ROWS = "SELECT set_config('tiered.changes_counted', 'on', true)"


def skip_row_counts(conn: Connection) -> None:
    """Before the statements that move partitions: the row trigger leaves them to `count_change`."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(_SKIP_ROWS)


def count_change(conn: Connection) -> None:
    """After them, if anything moved: one bump for all of them."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(_BUMP)
