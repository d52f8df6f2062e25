"""Executor leases: one process holds one executor key at a time. The lease is a Postgres
session advisory lock on a dedicated connection (freed at once when that session or process
dies) plus an epoch in ``executor_leases`` that the taker bumps. Signing checks the epoch in
its own database transaction (:mod:`relayer.store.executor_lane`), so a holder whose session
dropped while it kept running is fenced off the moment another process takes the key."""

from __future__ import annotations

import os
import socket
from typing import Final

import asyncpg

from relayer.store.pool import translated

# Take the session advisory lock named $1 if free; true when this session now holds it.
TRY_LOCK: Final = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"
# Take the lease of executor $2 on chain $1 for holder $3: a new epoch; returns it.
TAKE_EPOCH: Final = """
INSERT INTO executor_leases (chain_id, executor, epoch, holder) VALUES ($1, $2, 1, $3)
ON CONFLICT (chain_id, executor) DO UPDATE SET
    epoch = executor_leases.epoch + 1, holder = EXCLUDED.holder, taken_at = now()
RETURNING epoch
"""
# A round trip on the lease's own session: it fails once that session is gone.
PING: Final = "SELECT 1"
# Give back the session advisory lock named $1; true when this session held it.
UNLOCK: Final = "SELECT pg_advisory_unlock(hashtextextended($1, 0))"
HAND_BACK_TIMEOUT_S: Final = 2.0


def lease_name(chain_id: int, executor: str) -> str:
    """The advisory lock name of an executor's lease on a chain."""
    return f"relayer-executor:{chain_id}:{executor.lower()}"


class ExecutorLease:
    """The lease of (chain id, executor address) for this process.

    ``epoch`` is the epoch this process took (None while it holds no lease).
    """

    def __init__(self, dsn: str, chain_id: int, executor: str) -> None:
        self._dsn = dsn
        self.chain_id = chain_id
        self.executor = executor
        self._name = lease_name(chain_id, executor)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self._conn: asyncpg.Connection | None = None
        self.epoch: int | None = None

    async def try_acquire(self) -> bool:
        """Take the lease if it is free: the advisory lock, then a new epoch. True when this
        process now holds it (idempotent while it does).

        Raises:
            StoreUnavailable: the database failed (the session is dropped, freeing the lock).
        """
        if self.epoch is not None and await self.alive():
            return True
        await self.release()
        try:
            with translated():
                self._conn = await asyncpg.connect(self._dsn)
                if not await self._conn.fetchval(TRY_LOCK, self._name):
                    await self.release()
                    return False
                self.epoch = int(
                    await self._conn.fetchval(TAKE_EPOCH, self.chain_id, self.executor, self.holder)
                )
        except BaseException:
            await self.release()
            raise
        return True

    async def alive(self) -> bool:
        """Whether the lease's session still exists (and so still holds the advisory lock).
        A dead session means the lease may already be someone else's."""
        if self._conn is None or self._conn.is_closed():
            return False
        try:
            await self._conn.fetchval(PING, timeout=5)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        return True

    async def hand_back(self) -> int | None:
        """Give the lease up on purpose (this process is stopping): unlock the advisory lock
        on its session, confirmed by the server, then close the session, so that a process
        waiting for the key takes it at once. Returns the epoch given up; None when no lease
        was held or its session was already gone (then nothing of it is left to give up)."""
        conn, epoch = self._conn, self.epoch
        self._conn, self.epoch = None, None
        if conn is None or conn.is_closed():
            return None
        try:
            unlocked = await conn.fetchval(UNLOCK, self._name, timeout=HAND_BACK_TIMEOUT_S)
            await conn.close(timeout=HAND_BACK_TIMEOUT_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn.terminate()  # the session goes, and its lock with it
            return None
        return epoch if unlocked else None

    async def release(self) -> None:
        """Give the lease up (closing the session frees the advisory lock)."""
        conn, self._conn, self.epoch = self._conn, None, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
