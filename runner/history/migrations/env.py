"""Alembic's environment: run on the connection runner/history/database.py hands over (inside its
locked transaction), never from a URL of its own."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
