"""The durable path: a block object's bytes (block_format), the per-partition runs a block is built from
(block_builder), the upload-then-commit pipeline (block_pipeline), what an acknowledgement waits for (durable), and
the gate that lets produce skip the wait when nothing is due (hot_path)."""
