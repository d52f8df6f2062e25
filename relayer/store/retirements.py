"""Indexed retirements (one row per ``RetirementSettled`` event) and the indexer's cursor
(block number and hash). Rows are inserted idempotently with the cursor in one transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from relayer.store.pool import Database
from relayer.store.relay_jobs import MARK_INDEXED, Job, MovedJob


@dataclass(frozen=True, slots=True)
class IndexedRetirement:
    """One RetirementSettled event as stored. Money in input-token atomic units; amount in
    credit units (1000 a tonne); ``block_timestamp`` in unix seconds."""

    chain_id: int
    tx_hash: bytes
    retirement_index: int
    block_number: int
    block_hash: bytes
    log_index: int
    block_timestamp: int
    payer: str
    beneficiary: str
    input_token: str
    value: int
    fee: int
    retirement_cost: int
    refunded: int
    gas_allowance: int
    source: int
    source_id: int
    credit_token: str
    token_id: int
    amount_units: int
    project_id: str
    vintage: int
    registry: str
    bound_nonce: bytes
    details: dict[str, Any]


_COLUMNS = (
    "chain_id, tx_hash, retirement_index, block_number, block_hash, log_index, block_timestamp, payer, "
    "beneficiary, input_token, value, fee, retirement_cost, refunded, gas_allowance, source, source_id, "
    "credit_token, token_id, amount_units, project_id, vintage, registry, bound_nonce, details"
)
_NAMES: Final = tuple(_COLUMNS.split(", "))

# The indexer cursor named $2.
CURSOR: Final = "SELECT block_number, block_hash FROM indexer_cursor WHERE chain_id = $1 AND name = $2"
# Insert one indexed retirement; nothing when it is already there.
INSERT_RETIREMENT: Final = f"""
INSERT INTO retirements ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                                             $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25::jsonb)
ON CONFLICT (chain_id, tx_hash, retirement_index) DO NOTHING
"""
# Each column's type, in the order of _COLUMNS (the arrays SAVE_INDEXED unnests).
_TYPES: Final = (
    "int", "bytea", "int", "bigint", "bytea", "int", "bigint", "text", "text", "text", "numeric", "numeric",
    "numeric", "numeric", "numeric", "smallint", "numeric", "text", "numeric", "numeric", "text", "int",
    "text", "bytea", "jsonb",
)  # fmt: skip
# The index of a range on chain $1, in one statement (one round trip, atomic): the retirements
# (one array a column, $6 onward; nothing for one already there), the cursor named $3 advanced
# (never rewound) to block $4 with hash $5, and the confirmed jobs of the transactions $2 moved
# to indexed (relay_jobs.MARK_INDEXED: the jobs moved). Five round trips before: BEGIN, the
# retirements, the cursor, COMMIT, then the jobs.
SAVE_INDEXED: Final = (
    f"""
WITH saved AS (
    INSERT INTO retirements ({_COLUMNS})
    SELECT * FROM unnest({", ".join(f"${i + 6}::{t}[]" for i, t in enumerate(_TYPES))})
    ON CONFLICT (chain_id, tx_hash, retirement_index) DO NOTHING
), cursor AS (
    INSERT INTO indexer_cursor (chain_id, name, block_number, block_hash) VALUES ($1, $3, $4, $5)
    ON CONFLICT (chain_id, name) DO UPDATE SET block_number = EXCLUDED.block_number,
        block_hash = EXCLUDED.block_hash, updated_at = now()
    WHERE indexer_cursor.block_number <= EXCLUDED.block_number
)"""
    + MARK_INDEXED
)
# Retirements settled with authorization nonce $2, in whatever transaction.
BY_AUTHORIZATION: Final = f"""
SELECT {_COLUMNS} FROM retirements WHERE chain_id = $1 AND bound_nonce = $2
ORDER BY block_number, retirement_index
"""
# Relay jobs ($1 their ids) and, for each one indexed, the retirements of its transaction by
# index: the job's columns, then each retirement's prefixed "r_" (NULLs when there is none), a
# row each, by job id (one round trip for the answers of many waiting requests).
JOBS_AND_RETIREMENTS: Final = f"""
SELECT j.*, {", ".join(f"r.{c} AS r_{c}" for c in _NAMES)}
FROM relay_jobs j
LEFT JOIN retirements r ON j.state = 'indexed' AND r.chain_id = j.chain_id AND r.tx_hash = j.tx_hash
WHERE j.id = ANY($1::bigint[])
ORDER BY j.id, r.retirement_index
"""
# Retirements of one transaction (one index when $3 is not NULL), by index.
BY_TRANSACTION: Final = f"""
SELECT {_COLUMNS} FROM retirements WHERE chain_id = $1 AND tx_hash = $2
AND ($3::int IS NULL OR retirement_index = $3) ORDER BY retirement_index
"""

# Retirements of any indexed chain, newest first, filtered ($1 chain id, $2 beneficiary, $3 retiring
# address as recorded in the details, $4 project key; NULL = any), one page ($5 offset, $6 limit).
SEARCH: Final = f"""
SELECT {_COLUMNS} FROM retirements
WHERE ($1::int IS NULL OR chain_id = $1) AND ($2::text IS NULL OR beneficiary = $2)
  AND ($3::text IS NULL OR details->>'retiringAddress' = $3) AND ($4::text IS NULL OR project_id = $4)
ORDER BY block_timestamp DESC, chain_id, tx_hash, retirement_index
OFFSET $5 LIMIT $6
"""
SEARCH_COUNT: Final = """
SELECT count(*) FROM retirements
WHERE ($1::int IS NULL OR chain_id = $1) AND ($2::text IS NULL OR beneficiary = $2)
  AND ($3::text IS NULL OR details->>'retiringAddress' = $3) AND ($4::text IS NULL OR project_id = $4)
"""


def retirement_args(r: IndexedRetirement) -> tuple[Any, ...]:
    """The parameters of :data:`INSERT_RETIREMENT` for one retirement."""
    return (
        r.chain_id,
        r.tx_hash,
        r.retirement_index,
        r.block_number,
        r.block_hash,
        r.log_index,
        r.block_timestamp,
        r.payer,
        r.beneficiary,
        r.input_token,
        r.value,
        r.fee,
        r.retirement_cost,
        r.refunded,
        r.gas_allowance,
        r.source,
        r.source_id,
        r.credit_token,
        r.token_id,
        r.amount_units,
        r.project_id,
        r.vintage,
        r.registry,
        r.bound_nonce,
        json.dumps(r.details),
    )


def retirement_columns(retirements: Sequence[IndexedRetirement]) -> list[list[Any]]:
    """The column arrays of :data:`SAVE_INDEXED` for ``retirements`` (one array a column)."""
    rows = [retirement_args(r) for r in retirements]
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in _TYPES]


def _from_row(row: asyncpg.Record) -> IndexedRetirement:
    return _from_values(dict(row))


def _from_values(values: dict[str, Any]) -> IndexedRetirement:
    for key in (
        "value",
        "fee",
        "retirement_cost",
        "refunded",
        "gas_allowance",
        "source_id",
        "token_id",
        "amount_units",
    ):
        values[key] = int(values[key])
    values["tx_hash"] = bytes(values["tx_hash"])
    values["block_hash"] = bytes(values["block_hash"])
    values["bound_nonce"] = bytes(values["bound_nonce"])
    values["details"] = json.loads(values["details"])
    return IndexedRetirement(**values)


class RetirementStore:
    """Repository of indexed retirements and the indexer cursor.

    Every method raises ``StoreUnavailable`` when the database fails.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def cursor(self, chain_id: int, name: str) -> tuple[int, bytes | None] | None:
        row = await self.db.fetchrow(CURSOR, chain_id, name)
        if row is None:
            return None
        return int(row["block_number"]), None if row["block_hash"] is None else bytes(row["block_hash"])

    async def save(
        self,
        chain_id: int,
        name: str,
        block_number: int,
        block_hash: bytes | None,
        retirements: Sequence[IndexedRetirement],
        settled: Sequence[bytes] = (),
    ) -> list[MovedJob]:
        """Insert ``retirements`` (idempotent), advance the cursor ``name`` and move the
        confirmed jobs of the transactions ``settled`` to indexed, in one statement
        (:data:`SAVE_INDEXED`); returns the jobs moved (with their ``mined_at`` and
        ``indexed_at`` stamps).

        Raises:
            StoreUnavailable: the database failed (nothing was saved).
        """
        rows = await self.db.fetch(
            SAVE_INDEXED,
            chain_id,
            list(settled),
            name,
            block_number,
            block_hash,
            *retirement_columns(retirements),
        )
        return [MovedJob.from_row(r) for r in rows]

    async def by_bound_nonce(self, chain_id: int, nonce: bytes) -> list[IndexedRetirement]:
        """Retirements settled with this authorization nonce, in whatever transaction."""
        rows = await self.db.fetch(BY_AUTHORIZATION, chain_id, nonce)
        return [_from_row(r) for r in rows]

    async def job_and_retirements(self, job_id: int) -> tuple[Job, list[IndexedRetirement]] | None:
        """A relay job and, once it is ``indexed``, its transaction's retirements by index
        (:meth:`jobs_and_retirements` of one); None when there is no such job."""
        return (await self.jobs_and_retirements([job_id]))[0]

    async def jobs_and_retirements(
        self, job_ids: Sequence[int]
    ) -> list[tuple[Job, list[IndexedRetirement]] | None]:
        """For each of ``job_ids``, in their order: the relay job and, once it is ``indexed``,
        its transaction's retirements by index; None for an id with no job. One statement
        (:data:`JOBS_AND_RETIREMENTS`) whatever the count: the requests a block answers read
        their jobs together (:class:`~relayer.service.outcome.Outcomes`).

        Raises:
            StoreUnavailable: the database failed.
        """
        rows = await self.db.fetch(JOBS_AND_RETIREMENTS, list(dict.fromkeys(job_ids)))
        found: dict[int, tuple[Job, list[IndexedRetirement]]] = {}
        for row in rows:
            job_id = int(row["id"])
            if job_id not in found:
                found[job_id] = (Job.from_row(row), [])
            if row["r_tx_hash"] is not None:
                found[job_id][1].append(_from_values({name: row["r_" + name] for name in _NAMES}))
        return [found.get(job_id) for job_id in job_ids]

    async def by_transaction(
        self, chain_id: int, tx_hash: bytes, index: int | None = None
    ) -> list[IndexedRetirement]:
        """Retirements of one transaction (optionally one index), by index."""
        rows = await self.db.fetch(BY_TRANSACTION, chain_id, tx_hash, index)
        return [_from_row(r) for r in rows]

    async def search(
        self,
        chain_id: int | None,
        beneficiary: str | None,
        retiring: str | None,
        project: str | None,
        offset: int,
        limit: int,
    ) -> tuple[list[IndexedRetirement], int]:
        """One page of retirements across indexed chains, newest first, and how many match."""
        async with self.db.transaction() as conn:  # one snapshot for the page and its count
            rows = await conn.fetch(SEARCH, chain_id, beneficiary, retiring, project, offset, limit)
            total = await conn.fetchval(SEARCH_COUNT, chain_id, beneficiary, retiring, project)
        return [_from_row(r) for r in rows], int(total)
