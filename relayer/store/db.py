"""Postgres connection pool and migrations. The store layer is the only place with SQL.

Migrations are forward-only numbered SQL files in ``migrations/``, applied with
yoyo-migrations under a Postgres advisory lock so concurrent ``relayer migrate`` runs
(e.g. several pods starting at once) are safe.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psycopg
from yoyo import get_backend, read_migrations
from yoyo.connections import BadConnectionURI

log = logging.getLogger(__name__)

MIGRATIONS_DIR: Final = Path(__file__).resolve().parents[2] / "migrations"
_MIGRATION_LOCK_KEY: Final = 0x5245_4C41_5945_52  # "RELAYER"


def redact(dsn: str) -> str:
    """The DSN without password, for logs (never log a full DSN). Handles URLs and libpq
    ``key=value`` strings."""
    if "://" not in dsn:
        return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)
    parts = urlsplit(dsn)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}{host}", parts.path, "", ""))


def migrate(dsn: str, migrations_dir: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations; returns the ids applied (empty when up to date).

    Safe to run concurrently: the whole run holds a session advisory lock.
    """
    yoyo_dsn = dsn.replace("postgresql://", "postgresql+psycopg://", 1).replace(
        "postgres://", "postgresql+psycopg://", 1
    )
    try:
        return _migrate(dsn, yoyo_dsn, migrations_dir)
    except psycopg.OperationalError as exc:
        raise RuntimeError(f"cannot reach the database {redact(dsn)}: {type(exc).__name__}") from None
    except BadConnectionURI:
        raise RuntimeError(f"not a usable database URL: {redact(dsn)}") from None


def _migrate(dsn: str, yoyo_dsn: str, migrations_dir: Path) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as lock_conn:
        lock_conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK_KEY,))
        try:
            backend = get_backend(yoyo_dsn)
            migrations = read_migrations(str(migrations_dir))
            with backend.lock():
                pending = backend.to_apply(migrations)
                backend.apply_migrations(pending)
            applied = [m.id for m in pending]
            backend.connection.close()
        finally:
            lock_conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK_KEY,))
    if applied:
        log.info("migrations applied", extra={"applied": applied, "database": redact(dsn)})
    return applied


async def create_pool(dsn: str, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    """A connection pool; statements are prepared and cached per connection by asyncpg."""
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=30)
    assert pool is not None
    return pool
