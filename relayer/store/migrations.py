"""Schema migrations: forward-only numbered SQL files packaged in ``relayer/migrations/``,
applied with yoyo-migrations under a Postgres advisory lock so concurrent ``relayer migrate``
runs (e.g. several pods starting at once) are safe. DSNs are redacted in every message.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

import psycopg
from yoyo import get_backend, read_migrations
from yoyo.connections import BadConnectionURI

from relayer.config import ConfigError
from relayer.package_data import migrations_dir as migrations_dir_of_package
from relayer.store.pool import StoreUnavailable, database_line, libpq_cause, redact

log = logging.getLogger(__name__)

_MIGRATION_LOCK_KEY: Final = 0x5245_4C41_5945_52  # "RELAYER"
# Wait for, then hold, the migration lock for this session.
LOCK_MIGRATIONS: Final = "SELECT pg_advisory_lock(%s)"
# Release the migration lock.
UNLOCK_MIGRATIONS: Final = "SELECT pg_advisory_unlock(%s)"


def migrate(dsn: str, migrations_dir: Path | None = None) -> list[str]:
    """Apply pending migrations (default: the packaged ones); returns the ids applied
    (empty when up to date).

    Safe to run concurrently: the whole run holds a session advisory lock.

    Raises:
        ConfigError: the URL is unusable, or the database cannot be reached at the start: one
            line naming RELAYER_DATABASE_URL (without its password), the cause and the remedy.
        StoreUnavailable: the connection was lost mid-way.
        psycopg.Error: a migration failed (its SQL's own error; nothing of it applied).
    """
    migrations_dir = migrations_dir or migrations_dir_of_package()
    yoyo_dsn = dsn.replace("postgresql://", "postgresql+psycopg://", 1).replace(
        "postgres://", "postgresql+psycopg://", 1
    )
    try:
        lock_conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.ProgrammingError:  # not a DSN libpq can parse
        raise ConfigError(message=f"RELAYER_DATABASE_URL is not a usable URL: {redact(dsn)}") from None
    except psycopg.OperationalError as exc:
        raise ConfigError(message=database_line(dsn, libpq_cause(exc))) from None
    try:
        with lock_conn:
            applied = _apply(lock_conn, yoyo_dsn, migrations_dir)
    except psycopg.OperationalError as exc:  # the connection was lost mid-way
        raise StoreUnavailable(f"lost the database {redact(dsn)}: {type(exc).__name__}") from None
    except BadConnectionURI:
        raise ConfigError(message=f"RELAYER_DATABASE_URL is not a usable URL: {redact(dsn)}") from None
    if applied:
        log.info("migrations applied", extra={"applied": applied, "database": redact(dsn)})
    return applied


def _apply(lock_conn: psycopg.Connection[Any], yoyo_dsn: str, migrations_dir: Path) -> list[str]:
    """Apply what is pending while holding the migration lock on ``lock_conn``. A failing
    migration's own error (its SQL's) propagates as it is."""
    lock_conn.execute(LOCK_MIGRATIONS, (_MIGRATION_LOCK_KEY,))
    try:
        backend = get_backend(yoyo_dsn)
        try:
            migrations = read_migrations(str(migrations_dir))
            with backend.lock():
                pending = backend.to_apply(migrations)
                backend.apply_migrations(pending)
            return [m.id for m in pending]
        finally:
            backend.connection.close()
    finally:
        lock_conn.execute(UNLOCK_MIGRATIONS, (_MIGRATION_LOCK_KEY,))
