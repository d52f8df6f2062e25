"""The store's connection pool, with every connection-level failure translated into
:class:`StoreUnavailable` (the spec's retryable 503) at this one boundary. Repositories run
their named statements through it; nothing above the store sees an asyncpg type."""

from __future__ import annotations

import contextlib
import errno
import re
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from relayer.config import ConfigError
from relayer.domain.errors import Unavailable


class StoreUnavailable(Unavailable):
    """The database could not be reached, dropped the connection, is shutting down or
    refused more connections (transient: retry later)."""

    upstream = "database"
    cause: tuple[str, str] = ("it failed", "is Postgres up?")


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


# (what happened, what to do): the start-up line's words for each way a database fails.
DB_REFUSED: Final = ("connection refused", "is Postgres running, and listening on that port?")
DB_NO_HOST: Final = ("no such host", "check the host name")
DB_AUTH: Final = ("authentication failed", "check its user and password")
DB_NO_DATABASE: Final = ("no such database", "create it (createdb), or fix the database name")
DB_TIMEOUT: Final = ("no answer in time", "is Postgres up, and reachable from here?")


def database_line(dsn: str, cause: tuple[str, str]) -> str:
    """The one start-up line: ``RELAYER_DATABASE_URL <dsn without password>: <cause>; <remedy>``."""
    return f"RELAYER_DATABASE_URL {redact(dsn)}: {cause[0]}; {cause[1]}"


def database_cause(exc: BaseException) -> tuple[str, str] | None:
    """Why asyncpg could not connect, and the remedy: refused, no such host, authentication,
    no such database, no answer in time, or the class name of another outage; None when
    ``exc`` is no connection failure (a bug: let it propagate)."""
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return DB_NO_DATABASE
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):  # incl. InvalidPasswordError
        return DB_AUTH
    if isinstance(exc, socket.gaierror):
        return DB_NO_HOST
    if isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and (exc.errno == errno.ECONNREFUSED or "refused" in str(exc).lower())
    ):
        return DB_REFUSED
    if isinstance(exc, TimeoutError):
        return DB_TIMEOUT
    outage = _outage(exc)
    return None if outage is None else (f"it failed ({type(outage).__name__})", "is Postgres up?")


def libpq_cause(exc: BaseException) -> tuple[str, str]:
    """:func:`database_cause` for libpq's (psycopg's) connection errors, read from their
    SQLSTATE or, where the server was never reached, libpq's message."""
    state = getattr(exc, "sqlstate", None)
    text = str(exc).lower()
    if state == "3D000" or ("database" in text and "does not exist" in text):
        return DB_NO_DATABASE
    if (
        state in ("28P01", "28000")
        or "authentication failed" in text
        or "password" in text
        or ("role" in text and "does not exist" in text)
    ):
        return DB_AUTH
    if "translate host name" in text or "name or service not known" in text or "nodename nor" in text:
        return DB_NO_HOST
    if "refused" in text:
        return DB_REFUSED
    if "timeout" in text or "timed out" in text:
        return DB_TIMEOUT
    return (f"it failed ({type(exc).__name__})", "is Postgres up?")


# Failures of the server or the way to it, never of a statement's own input or logic.
UNAVAILABLE: Final = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)


# asyncpg lost track of its own protocol state, which a connection the server terminated
# mid-statement can leave behind (MagicStack/asyncpg#1069): that connection is unusable.
BROKEN: Final = (asyncpg.InternalClientError,)


# The server refused the DSN itself: its credentials or its database name.
REFUSED: Final = (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidCatalogNameError)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise a connection-level failure inside the block as :class:`StoreUnavailable`,
    and the server's refusal of the DSN as a :class:`ConfigError`."""
    try:
        yield
    except Unavailable:
        raise
    except REFUSED as exc:
        raise ConfigError(message=f"RELAYER_DATABASE_URL was refused: {type(exc).__name__}") from None
    except Exception as exc:
        outage = _outage(exc)
        if outage is None:
            raise
        raise StoreUnavailable(detail=type(outage).__name__) from None


_CHAIN_LIMIT: Final = 8


def _outage(exc: BaseException) -> BaseException | None:
    """The connection-level failure in ``exc`` or in what it was raised from or while
    handling (asyncpg follows a dropped connection with ``InterfaceError``s about the closed
    connection, e.g. from ``Transaction.__aexit__``); None when it is not an outage."""
    current: BaseException | None = exc
    for _ in range(_CHAIN_LIMIT):
        if current is None:
            return None
        if isinstance(current, UNAVAILABLE + BROKEN):
            return current
        current = current.__cause__ or current.__context__
    return None


class StatelessConnection(asyncpg.Connection):
    """A pooled connection, released without asyncpg's reset statement (``SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``, one more round trip after
    every use): the pool's connections never hold session state. Session advisory locks
    (the executor lease) and LISTEN (notifications) have connections of their own; the
    daemon never SETs a session variable nor keeps a cursor past its transaction; a
    transaction left open is still rolled back on release."""

    def get_reset_query(self) -> str:
        return ""


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
            StoreUnavailable: the server cannot be reached (``cause``: why, and the remedy).
            ConfigError: the server refused the credentials or the database name (one line:
                :func:`database_line`).
        """
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                command_timeout=30,
                connection_class=StatelessConnection,
            )
        except Exception as exc:
            cause = database_cause(exc)
            if cause is None:
                raise
            if isinstance(exc, REFUSED):
                raise ConfigError(message=database_line(dsn, cause)) from None
            unavailable = StoreUnavailable(detail=type(_outage(exc) or exc).__name__)
            unavailable.cause = cause
            raise unavailable from None
        assert pool is not None
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async with self.connection() as conn:
            return await conn.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        async with self.connection() as conn:
            return await conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        async with self.connection() as conn:
            return await conn.fetchval(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        async with self.connection() as conn:
            return await conn.execute(sql, *args)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        """One connection in one transaction; committed when the block ends, rolled back
        when it raises."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        """One pooled connection, failures translated; a connection whose protocol state
        asyncpg lost (:data:`BROKEN`) is terminated, so the pool opens a fresh one instead of
        handing it out again."""
        with translated():
            async with self.pool.acquire() as conn:
                try:
                    yield conn
                except BROKEN:
                    conn.terminate()
                    raise
