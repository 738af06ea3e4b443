"""Catalog revisions, one file each, written by hand (no autogenerate); Alembic skips this __init__."""
