"""Alembic's script directory for the history schema (runner/history/database.py runs it).

versions/r0001: the tables of the hand-written version-1 SQLite schema; versions/r0002: version 2
(the series columns and the run's status, filled from each stored report). An SQLite file written
before Alembic (a `meta.schema_version` of 1 or 2 and no `alembic_version` table) is stamped at
that revision and upgraded in place. A new table or column is a new revision here and a change
to runner/history/schema.py (tests/test_history_migrations.py checks that the two agree)."""
