"""tiered.storage"""
