"""Undoing what a reorg took away, in one database transaction: jobs whose block is gone go
back to ``submitted`` (their transactions become pending again and are re-sent), index rows
of lost blocks (retirements and the catalogue's credits, listing events and transfers, with
the touched listings folded again) are deleted, and the index cursor moves back to the common ancestor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from relayer.store.catalogue import rewind_catalogue
from relayer.store.pool import Database

# Jobs mined above block $2 on chain $1 wait again for a receipt (their block is gone).
REWIND_JOBS: Final = """
UPDATE relay_jobs SET state = 'submitted', block_number = NULL, block_hash = NULL, mined_at = NULL,
       confirmed_at = NULL, indexed_at = NULL, updated_at = now()
WHERE chain_id = $1 AND block_number > $2 AND state IN ('mined', 'confirmed', 'indexed', 'reverted')
RETURNING id, tx_hash, request_id
"""
# Transactions mined above block $2 are pending again, to be re-sent soon (the same bytes);
# what they paid is no longer paid.
REWIND_TRANSACTIONS: Final = """
UPDATE relay_transactions SET mined_block = NULL, broadcast_at = NULL, gas_used = NULL, paid_wei = NULL,
       succeeded = NULL
WHERE chain_id = $1 AND mined_block > $2
RETURNING tx_hash
"""
# Retirements indexed from blocks above $2 are no longer on the chain.
DELETE_RETIREMENTS: Final = (
    "DELETE FROM retirements WHERE chain_id = $1 AND block_number > $2 RETURNING tx_hash"
)
# The index cursors of chain $1 go back to block $2 (hash $3).
REWIND_CURSORS: Final = """
UPDATE indexer_cursor SET block_number = $2, block_hash = $3, updated_at = now()
WHERE chain_id = $1 AND block_number > $2
"""


@dataclass(frozen=True, slots=True)
class RewoundJob:
    """A job a rewind moved back to ``submitted`` (its transaction to be mined again)."""

    id: int
    tx_hash: bytes | None
    request_id: str | None


@dataclass(frozen=True, slots=True)
class Rewound:
    """What a rewind undid."""

    jobs: list[RewoundJob]
    transactions: int
    retirements: int


async def rewind(db: Database, chain_id: int, ancestor: int, ancestor_hash: bytes | None) -> Rewound:
    """Undo everything above block ``ancestor``, the last block the old and new chains share.

    Raises:
        StoreUnavailable: the database failed (nothing was undone).
    """
    async with db.transaction() as conn:
        jobs = [
            RewoundJob(r["id"], None if r["tx_hash"] is None else bytes(r["tx_hash"]), r["request_id"])
            for r in await conn.fetch(REWIND_JOBS, chain_id, ancestor)
        ]
        txs = await conn.fetch(REWIND_TRANSACTIONS, chain_id, ancestor)
        retirements = await conn.fetch(DELETE_RETIREMENTS, chain_id, ancestor)
        await rewind_catalogue(conn, chain_id, ancestor)
        await conn.execute(REWIND_CURSORS, chain_id, ancestor, ancestor_hash)
    return Rewound(jobs, len(txs), len(retirements))
