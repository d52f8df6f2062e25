"""What an operator and the readiness probe ask of the database: the oldest job per open
state, each executor lane's backlog of unmined nonces, the indexer cursors, whether an
executor lease is held by any live session, and whether the schema is at the packaged head.

Every method raises ``StoreUnavailable`` when the database fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from relayer.package_data import migrations_dir
from relayer.store.lease import lease_name
from relayer.store.pool import Database
from relayer.store.status import LOCK_HOLDERS

OPEN_STATES: Final = ("accepted", "simulated", "signed", "submitted", "mined", "confirmed")

# Seconds since the oldest job of each open state last changed.
OLDEST_BY_STATE: Final = """
SELECT state, extract(epoch FROM now() - min(updated_at))::float8 AS age FROM relay_jobs
WHERE state = ANY($1::text[]) GROUP BY state
"""
# Distinct unmined nonces per executor of chain $1 (signed, journalled, not yet mined).
NONCE_LAG: Final = """
SELECT executor, count(DISTINCT nonce) AS lag FROM relay_transactions
WHERE chain_id = $1 AND mined_block IS NULL GROUP BY executor
"""
CURSORS: Final = "SELECT chain_id, name, block_number FROM indexer_cursor ORDER BY chain_id, name"
APPLIED: Final = "SELECT migration_id FROM _yoyo_migration"


class OpsQueries:
    """Read-only operator queries."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def oldest_by_state(self) -> dict[str, float]:
        """Seconds since the oldest job of each open state last changed (absent: none)."""
        rows = await self.db.fetch(OLDEST_BY_STATE, list(OPEN_STATES))
        return {r["state"]: float(r["age"]) for r in rows}

    async def nonce_lag(self, chain_id: int) -> dict[str, int]:
        """Executor address (lower case) -> unmined nonces on its lane."""
        rows = await self.db.fetch(NONCE_LAG, chain_id)
        return {str(r["executor"]).lower(): int(r["lag"]) for r in rows}

    async def cursors(self) -> list[tuple[int, str, int]]:
        """(chain id, indexer name, last indexed block) of every cursor."""
        return [(int(r["chain_id"]), r["name"], int(r["block_number"])) for r in await self.db.fetch(CURSORS)]

    async def leases_held(self, chain_id: int, executors: Sequence[str]) -> set[str]:
        """The executors (as given) whose lease some live session holds now, read from
        ``pg_locks`` (taking no lock: a daemon trying for a lease never finds it busy
        because of a probe)."""
        names = {lease_name(chain_id, e): e for e in executors}
        return {names[r["name"]] for r in await self.db.fetch(LOCK_HOLDERS, list(names))}

    async def at_head(self) -> bool:
        """Whether every packaged migration is applied."""
        packaged = {p.stem for p in migrations_dir().glob("*.sql")}
        applied = {r["migration_id"] for r in await self.db.fetch(APPLIED)}
        return packaged <= applied
