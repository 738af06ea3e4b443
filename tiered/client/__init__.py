"""tiered.client"""
