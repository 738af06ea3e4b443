"""tiered.server"""
