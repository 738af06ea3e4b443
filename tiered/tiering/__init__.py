"""tiered.tiering"""
