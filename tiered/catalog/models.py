"""The catalog schema as SQLAlchemy 2 declarative models (docs/architecture.md, "Catalog").

The migrations in migrations/versions/ are written by hand and must build exactly this schema
(tests/catalog/test_migrations.py compares them). Query modules use the tables through these classes.

Conventions: seqs, positions and sizes are BIGINT (u64 on the wire; PostgreSQL has no unsigned type and seqs stay
far below 2**63); times are timezone-aware UTC datetimes (`UtcDateTime`) or integer `_ms` copied from messages.
A seq of 0 means "none", as on TANK's wire (seqs start at 1).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Text,
    TypeDecorator,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tiered.catalog.states import BlockState, SegmentState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only turns INTEGER PRIMARY KEY into an auto-incrementing rowid; PostgreSQL gets BIGSERIAL.
BlockId = BigInteger().with_variant(Integer(), "sqlite")

# Partial index predicate, spelled as a literal so that both planners can match it (a bound parameter in the
# query's WHERE cannot prove a partial index's predicate; query modules use the same literal).
COPY_FINISHED_PREDICATE = text(f"state = '{SegmentState.COPY_FINISHED}'")
DELETE_STARTED_PREDICATE = text(f"state = '{SegmentState.DELETE_STARTED}'")
COPY_STARTED_PREDICATE = text(f"state = '{SegmentState.COPY_STARTED}'")
RUNS_PENDING_PREDICATE = text("runs_pending IS NOT NULL")


class UtcDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on both backends.

    PostgreSQL stores timestamptz; SQLite stores naive UTC text, which compares correctly because SQLAlchemy always
    writes the same fixed-width format. Naive datetimes are refused: they are a bug waiting for a time zone.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the catalog stores UTC times, pass an aware datetime")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def _one_of(column: str, states: type) -> str:
    return f"{column} IN ({', '.join(repr(str(s)) for s in states)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class TopicModel(Base):
    __tablename__ = "topics"
    __table_args__ = (CheckConstraint("partitions >= 1", name="partitions_positive"),)

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    partitions: Mapped[int] = mapped_column(Integer)
    config_text: Mapped[str] = mapped_column(Text, server_default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class PartitionModel(Base):
    """One row per partition: who leads it, and what the catalog holds of it."""

    __tablename__ = "partitions"
    # Every commit rewrites the row of each partition it raises (on PostgreSQL a new row version): half of each page
    # is left free so that the new version lands on the row's own page (a HOT update, no primary key entry written).
    # ix_partitions_remote_bytes (0011): remote retention asks, for all partitions of a topic at once, which hold more
    # than remote.retention.bytes: a range scan of the partitions over the limit. Only copies and deletions change
    # remote_bytes, so a commit's update (hwmark_seq) stays HOT.
    # ix_partitions_change_version (0012): a broker's look reads the partitions changed since the version it last saw,
    # a range scan of what changed. Commits leave change_version alone, so their update stays HOT too.
    __table_args__ = (
        Index("ix_partitions_remote_bytes", "topic", "remote_bytes"),
        Index("ix_partitions_change_version", "change_version"),
        {"postgresql_with": {"fillfactor": 50}},
    )

    topic: Mapped[str] = mapped_column(Text, ForeignKey("topics.name", ondelete="CASCADE"), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    leader_broker: Mapped[int | None] = mapped_column(Integer)
    # Bumped by every claim: a broker's writes carry the epoch it claimed with, and are refused once it is stale.
    leader_epoch: Mapped[int] = mapped_column(BigInteger, server_default="0")
    first_available_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # The highest committed seq: what consumers of a durable topic may see.
    hwmark_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Bytes of COPY_FINISHED remote segments (object and index), for remote.retention.bytes.
    remote_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Asked of the leader by `tiered cluster rebalance`: hand the partition over to this broker, cleanly.
    handover_to: Mapped[int | None] = mapped_column(Integer)
    # The change counter's value taken by the transaction that last changed what a coordinator decides from (the
    # row's creation, leader, epoch, handover, first available seq once set): tiered.catalog.changes.
    change_version: Mapped[int] = mapped_column(BigInteger, server_default="0")


class PartitionEpochModel(Base):
    """The leadership history of a partition: one row per claim, written by the claim's own transaction.

    `start_seq` is the catalog's high-water mark + 1 when the epoch began, so epoch e holds the seqs
    [start_seq(e), start_seq(e + 1) - 1]. `disk_id` names the local volume the claiming broker served from: a broker
    reopening its disk knows from these rows whether another volume led the partition since, and from which seq
    its own records may diverge from the catalog's.
    """

    __tablename__ = "partition_epochs"
    __table_args__ = (
        ForeignKeyConstraint(["topic", "partition"], ["partitions.topic", "partitions.partition"], ondelete="CASCADE"),
    )

    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    leader_epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    broker_id: Mapped[int] = mapped_column(Integer)
    disk_id: Mapped[str] = mapped_column(Text)
    start_seq: Mapped[int] = mapped_column(BigInteger)
    claimed_at: Mapped[datetime] = mapped_column(UtcDateTime)


class BrokerModel(Base):
    """One row per broker id: where it is reached, and its lease (tiered.catalog.cluster)."""

    __tablename__ = "brokers"

    broker_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    address: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime)
    advertised: Mapped[str] = mapped_column(Text, server_default="")  # host:port of its TANK listener, for clients
    # host:port at which plaintext clients reach it: its main listener with TLS off, its plaintext listener
    # (--listen-plain) with TLS on; empty when it has none (0008). Redirects name it to plaintext clients.
    advertised_plain: Mapped[str] = mapped_column(Text, server_default="")
    http_endpoint: Mapped[str] = mapped_column(Text, server_default="")
    # A random token per process: a second process under the same id takes the row over; the first one's renewals
    # then fail and it stops leading.
    incarnation: Mapped[str] = mapped_column(Text, server_default="")
    # By the catalog's clock: the broker is live until then, and renews before.
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    process: Mapped[str] = mapped_column(Text, server_default="")  # "host:pid" of the process holding the lease


class ClusterChangeModel(Base):
    """One row (id 1): a counter the catalog's triggers bump whenever what the coordinators read changes: a
    partition created or deleted, its assigned leader, epoch or handover, its first available seq moved by retention,
    a topic created, deleted or reconfigured (migration 0006). A broker re-reads the assignments only when it moved
    (tiered.tiering.cluster.coordinator); committed high-water marks do not bump it."""

    __tablename__ = "cluster_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, server_default="0")


class BlockModel(Base):
    """One multi-partition object in the bucket. The row exists before the object does (the intent row)."""

    __tablename__ = "blocks"
    __table_args__ = (
        CheckConstraint(_one_of("state", BlockState), name="state"),
        # The sweeper's scan (deleting, oldest delete_after first) and the pending-upload scan.
        Index(None, "state", "delete_after"),
        Index(None, "state", "created_at"),
        # The blocks whose runs are not in block_runs yet (0013): a handful at any time (a block is expanded right
        # after its acknowledgements), so "which blocks are unexpanded" is a scan of this partial index alone.
        Index("ix_blocks_runs_pending", "committed_at", postgresql_where=RUNS_PENDING_PREDICATE,
              sqlite_where=RUNS_PENDING_PREDICATE),
        {"sqlite_autoincrement": True},  # never reuse a swept block's id
    )

    block_id: Mapped[int] = mapped_column(BlockId, primary_key=True, autoincrement=True)
    object_key: Mapped[str] = mapped_column(Text, unique=True)
    state: Mapped[str] = mapped_column(Text)
    broker_id: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    committed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # When the sweeper may delete the object: set on entering `deleting`, a grace period after.
    delete_after: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # A committed block's runs, packed (tiered.catalog.blocks.pack_runs), until they are expanded into block_runs
    # (0013): set by commit_block on PostgreSQL, cleared by the expansion in the transaction that inserts the rows,
    # so each run is in exactly one of the two places at every instant. NULL on every other block.
    runs_pending: Mapped[bytes | None] = mapped_column(LargeBinary)


class BlockRunModel(Base):
    """One partition's records inside a block: a byte range that is a valid consume chunk."""

    __tablename__ = "block_runs"
    __table_args__ = (
        CheckConstraint("first_seq <= last_seq", name="seq_range"),
        CheckConstraint("from_seq <= first_seq", name="from_seq"),
        # The fetch lookup: the run with the smallest last_seq >= seq, answered from the index alone on PostgreSQL.
        Index(
            "ix_block_runs_lookup",
            "topic",
            "partition",
            "last_seq",
            postgresql_include=["first_seq", "position", "length_bytes", "block_id", "from_seq", "min_ts_ms",
                                "max_ts_ms"],
        ),
        # "Does any run still reference this block?" (asked on every prune) is a probe of the primary key, whose first
        # column is block_id: no index of its own (0005). No foreign key to blocks either (0005): its trigger ran once
        # per run of every commit, and the transitions keep every run's block row (blocks.py).
    )

    block_id: Mapped[int] = mapped_column(BlockId, primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    topic: Mapped[str] = mapped_column(Text)
    partition: Mapped[int] = mapped_column(Integer)
    # The seqs this run answers for: [from_seq, last_seq]. from_seq is the catalog's high-water mark + 1 when the
    # run was committed (the commit proves it), below first_seq only where a produce jumped seqs: a seq in
    # [from_seq, first_seq) holds no message and reads from first_seq on, as in TANK.
    from_seq: Mapped[int] = mapped_column(BigInteger)
    first_seq: Mapped[int] = mapped_column(BigInteger)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    length_bytes: Mapped[int] = mapped_column(BigInteger)
    messages: Mapped[int] = mapped_column(Integer)
    min_ts_ms: Mapped[int] = mapped_column(BigInteger)
    max_ts_ms: Mapped[int] = mapped_column(BigInteger)
    # The epoch its broker held when the commit checked it (0 for runs committed before epochs were recorded).
    leader_epoch: Mapped[int] = mapped_column(BigInteger, server_default="0")


class SegmentModel(Base):
    """One sealed segment copied to the bucket: a TANK .ilog and its .index, unchanged."""

    __tablename__ = "segments"
    __table_args__ = (
        CheckConstraint(_one_of("state", SegmentState), name="state"),
        CheckConstraint("base_seq <= last_seq", name="seq_range"),
        CheckConstraint("from_seq <= base_seq", name="from_seq"),
        # Lookup by seq, retention and highest-copied scans only ever want readable segments: a partial index
        # keeps deleted segments out of the scan, so its cost does not grow with history.
        Index(
            "ix_segments_lookup",
            "topic",
            "partition",
            "last_seq",
            postgresql_where=COPY_FINISHED_PREDICATE,
            sqlite_where=COPY_FINISHED_PREDICATE,
        ),
        # Remote retention first finishes deletions an interrupted pass left in DELETE_STARTED: without this index
        # that lookup walks every DELETE_FINISHED row of the partition. It holds only the few rows mid-deletion.
        Index(
            "ix_segments_delete_started",
            "topic",
            "partition",
            "base_seq",
            postgresql_where=DELETE_STARTED_PREDICATE,
            sqlite_where=DELETE_STARTED_PREDICATE,
        ),
        # The cleanup of abandoned copies looks for old COPY_STARTED rows across every led partition in one
        # statement (0007): the index holds only the copies in flight or abandoned.
        Index(
            "ix_segments_copy_started",
            "topic",
            "partition",
            "base_seq",
            postgresql_where=COPY_STARTED_PREDICATE,
            sqlite_where=COPY_STARTED_PREDICATE,
        ),
        # Remote retention asks, for all partitions of a topic at once, which hold a readable segment frozen before
        # the topic's cutoff (0011): a range scan of the segments past their age, not of every partition's oldest.
        Index(
            "ix_segments_expiry",
            "topic",
            "freeze_ts",
            postgresql_where=COPY_FINISHED_PREDICATE,
            sqlite_where=COPY_FINISHED_PREDICATE,
        ),
    )

    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    base_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    # The seqs this segment answers for, [from_seq, last_seq]: from_seq is the from_seq of the block run that held
    # its first record (so a jump before the segment's base is the segment's), else base_seq.
    from_seq: Mapped[int] = mapped_column(BigInteger)
    object_key: Mapped[str] = mapped_column(Text, unique=True)
    index_object_key: Mapped[str] = mapped_column(Text, unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    index_size_bytes: Mapped[int] = mapped_column(BigInteger)
    min_ts_ms: Mapped[int] = mapped_column(BigInteger)
    max_ts_ms: Mapped[int] = mapped_column(BigInteger)
    # TANK's freezeTS (the .ilog name's last field, seconds) as a datetime: remote.retention.secs counts from it.
    freeze_ts: Mapped[datetime] = mapped_column(UtcDateTime)
    leader_epoch: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ObjectUsageModel(Base):
    """What each broker's cost meter counted (tiered.tiering.objects.meter), per hour: object store requests per operation
    and bytes per direction, per topic ("(catalog)" for catalog-wide work). Brokers add to their rows
    (tiered.catalog.usage); `tiered cost` sums them over a window of whole hours (migration 0009)."""

    __tablename__ = "object_usage"

    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)  # the hour's start, UTC
    broker_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    # An operation (requests: put, get, head, list, delete, copy, part, multipart) or a direction (bytes: written,
    # read), as tiered.catalog.usage names them.
    measure: Mapped[str] = mapped_column(Text, primary_key=True)
    amount: Mapped[float] = mapped_column(Float)
