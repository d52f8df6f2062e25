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


class ChainIdentity:
    """Repository of the chain identity. Raises ``StoreUnavailable`` when the database fails."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def record(self, chain_id: int, genesis_hash: bytes) -> bytes:
        """Record ``genesis_hash`` for ``chain_id`` if none is recorded; returns the genesis
        hash the database belongs to (equal to the argument unless the chain changed)."""
        return bytes(await self.db.fetchval(RECORD_GENESIS, chain_id, genesis_hash))
