"""Executor leases: one replica holds one executor key at a time, as a Postgres session
advisory lock on a dedicated connection (released when the connection or process dies)."""

from __future__ import annotations

import asyncpg


class ExecutorLease:
    """Advisory lock named after (chain id, executor address)."""

    def __init__(self, dsn: str, chain_id: int, executor: str) -> None:
        self._dsn = dsn
        self._name = f"relayer-executor:{chain_id}:{executor.lower()}"
        self._conn: asyncpg.Connection | None = None

    async def try_acquire(self) -> bool:
        """True when this process now holds the lease (idempotent)."""
        if self._conn is None:
            self._conn = await asyncpg.connect(self._dsn)
        held = await self._conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", self._name)
        return bool(held)

    async def release(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
