"""tiered.cli"""
