"""The tiered layer between TANK's local segments and the bucket, one sub-package per concern: objects/ (the
ObjectStore interface, its backends, object keys), blocks/ (the durable path: block objects and acknowledgements),
segments/ (sealed segments copied, retained and cleaned up in the bucket), reads/ (history served from the bucket),
compaction/ (compaction of history in the bucket), cluster/ (several brokers as one service), recovery/ (the
catalog rebuilt from and reconciled with the bucket). Beside them: the per-partition tier state's one owner
(partition_state), the catalog calls with their deadlines (catalog_access), the remote side of one partition
(remote_tier) and the service that wires them (service)."""
