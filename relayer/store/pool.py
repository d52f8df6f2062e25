"""The store's connection pool, with every connection-level failure translated into
:class:`StoreUnavailable` (the spec's retryable 503) at this one boundary. Repositories run
their named statements through it; nothing above the store sees an asyncpg type."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from relayer.config import ConfigError
from relayer.domain.errors import Unavailable


class StoreUnavailable(Unavailable):
    """The database could not be reached, dropped the connection, is shutting down or
    refused more connections (transient: retry later)."""

    upstream = "database"


# Failures of the server or the way to it, never of a statement's own input or logic.
UNAVAILABLE: Final = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)


# The server refused the DSN itself: its credentials or its database name.
REFUSED: Final = (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidCatalogNameError)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise a connection-level failure inside the block as :class:`StoreUnavailable`,
    and the server's refusal of the DSN as a :class:`ConfigError`."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise StoreUnavailable(detail=type(exc).__name__) from None
    except REFUSED as exc:
        raise ConfigError(message=f"RELAYER_DATABASE_URL was refused: {type(exc).__name__}") from None


class Database:
    """An asyncpg pool whose failures surface as :class:`StoreUnavailable`.

    Statements are prepared and cached per connection by asyncpg.
    """

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(cls, dsn: str, min_size: int = 2, max_size: int = 10) -> Database:
        """Open the pool (bounded: 30 s per statement).

        Raises:
            StoreUnavailable: the server cannot be reached.
            ConfigError: the server refused the credentials or the database name.
        """
        with translated():
            pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=30)
        assert pool is not None
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        with translated():
            return await self.pool.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        with translated():
            return await self.pool.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        with translated():
            return await self.pool.fetchval(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        with translated():
            return await self.pool.execute(sql, *args)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        """One connection in one transaction; committed when the block ends, rolled back
        when it raises."""
        with translated():
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn
