"""The catalog's Alembic environment (env.py) and revisions (versions/).

A package so that it ships in the wheel: `tiered db upgrade` (tiered.catalog.migrate) finds this folder through
the import system, from a checkout and from an installed package alike. There is no alembic.ini; the Alembic
configuration is built in code by tiered.catalog.migrate.alembic_config.
"""
