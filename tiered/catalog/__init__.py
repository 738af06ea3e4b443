"""The catalog: PostgreSQL (SQLite as the embedded single-node default) indexing every byte in the bucket.

Every function takes a `Catalog` first and is one transaction; SQL lives only in this package. Modules by noun:
`topics`, `brokers`, `partitions`, `blocks`, `segments`; `restore` writes the rows `tiered catalog rebuild`
restores from the bucket; `migrate` runs the Alembic migrations in migrations/.

    from tiered.catalog import Catalog, blocks
    cat = Catalog.open("postgresql+psycopg://tiered@db/tiered")
    block_id = blocks.insert_pending_block(cat, object_key, broker_id, size_bytes)
"""

from tiered.catalog.engine import Catalog, mask_url
from tiered.catalog.errors import (
    CatalogError,
    CatalogUnavailable,
    IllegalTransition,
    NotFound,
    StaleEpoch,
    TopicExists,
    UnknownBlock,
    UnknownPartition,
    UnknownSegment,
    UnknownTopic,
)
from tiered.catalog.states import BlockState, SegmentState

__all__ = [
    "BlockState",
    "Catalog",
    "CatalogError",
    "CatalogUnavailable",
    "IllegalTransition",
    "NotFound",
    "SegmentState",
    "StaleEpoch",
    "TopicExists",
    "UnknownBlock",
    "UnknownPartition",
    "UnknownSegment",
    "UnknownTopic",
    "mask_url",
]
