"""Alembic environment: migrations always run on a connection handed over by ``Database.migrate``."""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through core.store.Database.migrate(), which supplies a connection")

context.configure(
    connection=connection,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
