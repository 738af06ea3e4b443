"""tiered: an object-storage tiered broker that speaks TANK's wire protocol."""

__version__ = "0.1.0"
