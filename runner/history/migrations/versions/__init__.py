"""The history schema's revisions, oldest first (Alembic reads them by `revision`/`down_revision`)."""
