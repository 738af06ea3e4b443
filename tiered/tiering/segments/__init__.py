"""Sealed segments in the bucket: copying them (segment_copier), their retention (remote_retention), and cleaning
up copies that were started and never finished (abandoned_copies)."""
