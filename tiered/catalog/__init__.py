"""tiered.catalog"""
