"""Reading history the broker does not hold: from a remote segment or a block run (remote_fetch, run_reads), in
byte ranges with read-ahead (range_reads, remote_chunks), through small caches of object sizes and footers (caches)."""
