"""The change counter the coordinators look at, and the change version of each partition (migrations 0006, 0010,
0012): a broker's look reads the counter, then only the partitions changed since the value it saw last.

`cluster_changes.version` moves with every change a cluster decision depends on (topics, partitions inserted, a
partition's leader, epoch, handover, first available seq once set), and each changed partition row carries, in
`change_version`, the counter's value its transaction took. A commit that only raises `hwmark_seq` moves neither.

Why a reader never misses a change: a version is taken by updating the counter row (`take_version`), whose lock
is held until the transaction ends. So the transaction that took v has committed (and is visible) before any other
can take v + 1: versions are in commit order, unlike a sequence's values. A reader that read the counter at V (in
one statement, then read the rows changed since its previous V' in a later one) has therefore seen every row of a
version in (V', V]; rows of a later version it may see too, and reads again next time (a row is applied as it is
now, so twice is harmless). Lock order: partition rows first, then the counter row (every writer of many rows takes
its version after locking them; the row triggers of migration 0012 after the row's own update).

A writer of many rows (a claim, a handover's assignment, a creation) takes one version per transaction and writes
it on every row it changes, so the counter row is updated once, not once per partition (per row it was half of a
claim's time in PostgreSQL, and made the claims of several brokers queue on that row); a statement that leaves
`change_version` as it was is versioned by the row trigger instead.

Notices (PostgreSQL): the transactions that take a version here (claims, a handover's assignment, a creation) also
notify `NOTICE_CHANNEL`, delivered at their commit to every broker listening (tiered.tiering.cluster.notices), which
then looks at once instead of at its next idle tick. A notice only wakes a look: what changed is still read from the
versions, so a notice lost (a listener reconnecting) or never sent (a change versioned by the row trigger) is seen
at the next idle tick instead.
"""

from __future__ import annotations

from sqlalchemy import Connection

# An upsert: a catalog whose tables were emptied (TRUNCATE) counts again from its next change (a reader that sees the
# counter go back looks at everything again: tiered.tiering.cluster.coordinator).
_TAKE = ("INSERT INTO cluster_changes (id, version) VALUES (1, 1) "
         "ON CONFLICT (id) DO UPDATE SET version = cluster_changes.version + 1 RETURNING version")
NOTICE_CHANNEL = "tiered_changes"
# The same, and the notice, in one statement (delivered when the transaction commits; PostgreSQL sends one notice per
# transaction and channel however many it was asked for).
_TAKE_AND_NOTIFY = f"WITH v AS ({_TAKE}) SELECT v.version, pg_notify('{NOTICE_CHANNEL}', '') FROM v"


def take_version(conn: Connection) -> int:
    """The next change version, for the rows this transaction changes: the counter moved once, its row locked until
    the transaction ends (take it after locking the partition rows, and as late as the statements allow: other
    writers of versions wait for it)."""
    take = _TAKE_AND_NOTIFY if conn.dialect.name == "postgresql" else _TAKE
    return int(conn.exec_driver_sql(take).first()[0])
