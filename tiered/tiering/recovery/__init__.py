"""Rebuilding the catalog from the bucket (rebuild) and reconciling the two when they disagree (reconciler)."""
