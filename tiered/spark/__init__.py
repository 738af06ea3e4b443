"""tiered.spark"""
