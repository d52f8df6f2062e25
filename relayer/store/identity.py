"""The chain a database belongs to (chain id and genesis hash), recorded once: the guard
against running one database's jobs, nonces and index against another chain."""

from __future__ import annotations

from typing import Final

from relayer.store.pool import Database

# Record the genesis of chain $1 unless one is recorded; then the recorded one.
RECORD_GENESIS: Final = """
WITH recorded AS (
    INSERT INTO chain_identity (chain_id, genesis_hash) VALUES ($1, $2)
    ON CONFLICT (chain_id) DO NOTHING
    RETURNING genesis_hash
)
SELECT genesis_hash FROM recorded
UNION ALL
SELECT genesis_hash FROM chain_identity WHERE chain_id = $1
LIMIT 1
"""

# The recorded genesis of each chain of $1.
GENESES: Final = "SELECT chain_id, genesis_hash FROM chain_identity WHERE chain_id = ANY($1::bigint[])"


class ChainIdentity:
    """Repository of the chain identity. Raises ``StoreUnavailable`` when the database fails."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def record(self, chain_id: int, genesis_hash: bytes) -> bytes:
        """Record ``genesis_hash`` for ``chain_id`` if none is recorded; returns the genesis
        hash the database belongs to (equal to the argument unless the chain changed)."""
        return bytes(await self.db.fetchval(RECORD_GENESIS, chain_id, genesis_hash))

    async def geneses(self, chain_ids: list[int]) -> dict[int, bytes]:
        """The recorded genesis hash of each of ``chain_ids`` that has one (a chain whose
        node no process has checked yet has none)."""
        rows = await self.db.fetch(GENESES, chain_ids)
        return {int(r["chain_id"]): bytes(r["genesis_hash"]) for r in rows}
