"""Executor leases: one replica holds one executor key at a time, as a Postgres session
advisory lock on a dedicated connection (released when the connection or process dies)."""

from __future__ import annotations

from typing import Final

import asyncpg

# Take the session advisory lock named $1 if free; true when this session now holds it.
TRY_LOCK: Final = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"


class ExecutorLease:
    """Advisory lock named after (chain id, executor address)."""

    def __init__(self, dsn: str, chain_id: int, executor: str) -> None:
        self._dsn = dsn
        self._name = f"relayer-executor:{chain_id}:{executor.lower()}"
        self._conn: asyncpg.Connection | None = None

    async def try_acquire(self) -> bool:
        """True when this process now holds the lease (idempotent). A broken connection is
        dropped (which frees the lock server-side) and the error re-raised."""
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self._dsn)
        try:
            held = await self._conn.fetchval(TRY_LOCK, self._name)
        except Exception:
            await self.release()
            raise
        return bool(held)

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
