"""Compaction of history in the bucket: choosing and rewriting a partition's remote segments (remote_compaction) and
the byte-level rewrite of one group of segments (bucket_compaction)."""
