"""The marketplace catalogue's tables: carbon projects (loaded from the data set), and what the
catalogue indexer reads from each chain — registered credits, listing events with the
listings folded from them, and credit transfers. Indexed rows and the cursor are written in
one transaction; a reorg deletes what lost blocks held and folds the touched listings again.

Amounts: credit units (1000 a tonne) and USDC atomic units; times: unix seconds.
Every method raises ``StoreUnavailable`` when the database fails.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from relayer.domain.marketplace import (
    ZERO_ADDRESS,
    CreditRegistration,
    ListingEvent,
    ListingState,
    Transfer,
    fold_listing,
)
from relayer.store.pool import Database
from relayer.store.retirements import CURSOR, INSERT_RETIREMENT, IndexedRetirement, retirement_args

# Insert projects ($1..$5: keys, registries, countries, categories, records as JSON text; $6
# the load time) or replace those whose record changed; returns the key of each row written.
UPSERT_PROJECTS: Final = """
INSERT INTO carbon_projects (key, registry, country, category, record, loaded_at)
SELECT r.key, r.registry, r.country, r.category, r.record::jsonb, $6
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
    AS r(key, registry, country, category, record)
ON CONFLICT (key) DO UPDATE SET registry = EXCLUDED.registry, country = EXCLUDED.country,
    category = EXCLUDED.category, record = EXCLUDED.record, loaded_at = EXCLUDED.loaded_at
WHERE carbon_projects.record IS DISTINCT FROM EXCLUDED.record
RETURNING key
"""
# The catalogue's version: how many projects, and the sum of their rows' transaction ids
# (xmin), which every insert or changed record moves, even two loads within one second
# (loaded_at has whole seconds). A reader reloads when this moves.
CATALOGUE_VERSION: Final = "SELECT count(*), coalesce(sum(xmin::text::bigint), 0) FROM carbon_projects"
# Every project record, by key.
ALL_PROJECTS: Final = "SELECT record::text AS record, loaded_at FROM carbon_projects ORDER BY key"
# Register a credit (idempotent).
INSERT_CREDIT: Final = """
INSERT INTO chain_credits (chain_id, credit_token, token_id, project_key, vintage, registry, block_number)
VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING
"""
# Record a listing event (idempotent).
INSERT_LISTING_EVENT: Final = """
INSERT INTO listing_events (chain_id, block_number, log_index, tx_hash, block_timestamp, marketplace,
                            listing_id, kind, data)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb) ON CONFLICT DO NOTHING
"""
# Record a credit transfer (idempotent).
INSERT_TRANSFER: Final = """
INSERT INTO credit_transfers (chain_id, block_number, log_index, batch_index, tx_hash, block_timestamp,
                              credit_token, token_id, sender, receiver, amount)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING
"""
_LISTING_COLUMNS: Final = (
    "listing_id, seller, credit_token, token_id, unit_price, total_amount, left_to_sell, min_fill, "
    "expiration, active, created_block, created_at, updated_block, updated_at"
)
# Listings $3 of marketplace $2 on chain $1, as folded so far.
LISTINGS_BY_ID: Final = f"""
SELECT {_LISTING_COLUMNS} FROM listings
WHERE chain_id = $1 AND marketplace = $2 AND listing_id = ANY($3::numeric[])
"""
# Write a listing as folded.
UPSERT_LISTING: Final = f"""
INSERT INTO listings (chain_id, marketplace, {_LISTING_COLUMNS})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (chain_id, marketplace, listing_id) DO UPDATE SET seller = EXCLUDED.seller,
    credit_token = EXCLUDED.credit_token, token_id = EXCLUDED.token_id, unit_price = EXCLUDED.unit_price,
    total_amount = EXCLUDED.total_amount, left_to_sell = EXCLUDED.left_to_sell, min_fill = EXCLUDED.min_fill,
    expiration = EXCLUDED.expiration, active = EXCLUDED.active, created_block = EXCLUDED.created_block,
    created_at = EXCLUDED.created_at, updated_block = EXCLUDED.updated_block, updated_at = EXCLUDED.updated_at
"""
ADVANCE_CURSOR: Final = """
INSERT INTO indexer_cursor (chain_id, name, block_number, block_hash) VALUES ($1, $2, $3, $4)
ON CONFLICT (chain_id, name) DO UPDATE SET block_number = EXCLUDED.block_number,
    block_hash = EXCLUDED.block_hash, updated_at = now()
"""
# --- reorg: what blocks above $2 on chain $1 held
DELETE_LISTING_EVENTS: Final = """
DELETE FROM listing_events WHERE chain_id = $1 AND block_number > $2 RETURNING marketplace, listing_id
"""
DELETE_TRANSFERS: Final = "DELETE FROM credit_transfers WHERE chain_id = $1 AND block_number > $2"
DELETE_CREDITS: Final = "DELETE FROM chain_credits WHERE chain_id = $1 AND block_number > $2"
# The remaining events of one listing, in chain order.
EVENTS_OF_LISTING: Final = """
SELECT block_number, log_index, tx_hash, block_timestamp, kind, data::text AS data FROM listing_events
WHERE chain_id = $1 AND marketplace = $2 AND listing_id = $3 ORDER BY block_number, log_index
"""
DELETE_LISTING: Final = "DELETE FROM listings WHERE chain_id = $1 AND marketplace = $2 AND listing_id = $3"
# Rewind one cursor of chain $1 to block $3 (hash $4) when it is above it.
REWIND_CURSOR: Final = """
UPDATE indexer_cursor SET block_number = $3, block_hash = $4, updated_at = now()
WHERE chain_id = $1 AND name = $2 AND block_number > $3
"""
DELETE_RETIREMENTS: Final = "DELETE FROM retirements WHERE chain_id = $1 AND block_number > $2"

# --- live state of the catalogue (a few rows per credit, not per project)
ALL_CREDITS: Final = (
    "SELECT chain_id, credit_token, token_id, project_key, vintage, registry FROM chain_credits"
)
# Minted, burned and last movement of each credit.
CREDIT_TOTALS: Final = """
SELECT chain_id, credit_token, token_id,
       coalesce(sum(amount) FILTER (WHERE sender = $1), 0) AS minted,
       coalesce(sum(amount) FILTER (WHERE receiver = $1), 0) AS burned,
       max(block_timestamp) AS last_moved
FROM credit_transfers GROUP BY chain_id, credit_token, token_id
"""
# Balances of credits held by the given holders (chain $1[i] holder $2[i]): the class pools.
HOLDER_BALANCES: Final = """
SELECT t.chain_id, t.credit_token, t.token_id,
       sum(CASE WHEN t.receiver = h.holder THEN t.amount ELSE 0 END)
     - sum(CASE WHEN t.sender = h.holder THEN t.amount ELSE 0 END) AS balance
FROM unnest($1::int[], $2::text[]) AS h(chain_id, holder)
JOIN credit_transfers t ON t.chain_id = h.chain_id AND (t.receiver = h.holder OR t.sender = h.holder)
GROUP BY t.chain_id, t.credit_token, t.token_id
"""
# Listings offered at $1 (unix s): active, not sold out, not expired.
LIVE_LISTINGS: Final = f"""
SELECT chain_id, marketplace, {_LISTING_COLUMNS} FROM listings
WHERE active AND left_to_sell > 0 AND expiration > $1
"""
# One listing.
LISTING: Final = f"""
SELECT chain_id, marketplace, {_LISTING_COLUMNS} FROM listings WHERE chain_id = $1 AND listing_id = $2
ORDER BY marketplace LIMIT 1
"""
# Transfers of one credit up to a position (provenance), oldest first, bounded.
TRANSFERS_OF_CREDIT: Final = """
SELECT block_number, log_index, batch_index, tx_hash, block_timestamp, sender, receiver, amount
FROM credit_transfers WHERE chain_id = $1 AND credit_token = $2 AND token_id = $3 AND block_number <= $4
ORDER BY block_number, log_index, batch_index LIMIT $5
"""


@dataclass(frozen=True, slots=True)
class ProjectRow:
    """A catalogue record as loaded (``record``: the data set's JSON object)."""

    record: dict[str, Any]
    loaded_at: int


@dataclass(frozen=True, slots=True)
class ChainCredit:
    """A credit registered on a chain."""

    chain_id: int
    credit_token: str
    token_id: int
    project_key: str
    vintage: int
    registry: str


@dataclass(frozen=True, slots=True)
class CreditTotals:
    """Units minted and burned of one credit, and the time it last moved (unix s)."""

    minted: int
    burned: int
    last_moved: int


@dataclass(frozen=True, slots=True)
class ChainListing:
    """A folded listing and where it lives."""

    chain_id: int
    marketplace: str
    state: ListingState


@dataclass(frozen=True, slots=True)
class IndexBatch:
    """What one range of blocks of one chain adds to the catalogue."""

    chain_id: int
    marketplace: str
    credit_token: str
    credits: Sequence[CreditRegistration]
    listing_events: Sequence[ListingEvent]
    transfers: Sequence[tuple[int, Transfer]]  # (token id, transfer)
    retirements: Sequence[IndexedRetirement] = ()


def _listing(row: asyncpg.Record) -> ListingState:
    return ListingState(
        int(row["listing_id"]),
        row["seller"],
        row["credit_token"],
        int(row["token_id"]),
        int(row["unit_price"]),
        int(row["total_amount"]),
        int(row["left_to_sell"]),
        int(row["min_fill"]),
        int(row["expiration"]),
        bool(row["active"]),
        int(row["created_block"]),
        int(row["created_at"]),
        int(row["updated_block"]),
        int(row["updated_at"]),
    )


def _listing_args(chain_id: int, marketplace: str, s: ListingState) -> tuple[Any, ...]:
    return (
        chain_id,
        marketplace,
        s.listing_id,
        s.seller,
        s.credit_token,
        s.token_id,
        s.unit_price,
        s.total_amount,
        s.left_to_sell,
        s.min_fill,
        s.expiration,
        s.active,
        s.created_block,
        s.created_at,
        s.updated_block,
        s.updated_at,
    )


def _transfer(row: asyncpg.Record) -> Transfer:
    return Transfer(
        int(row["block_number"]),
        int(row["log_index"]),
        int(row["batch_index"]),
        bytes(row["tx_hash"]),
        int(row["block_timestamp"]),
        row["sender"],
        row["receiver"],
        int(row["amount"]),
    )


class CatalogueStore:
    """Repository of the catalogue and its index."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ projects

    async def load_projects(self, records: Sequence[dict[str, Any]], loaded_at: int) -> int:
        """Insert or update projects (``key``, ``registry``, ``country``, ``category`` read from
        each record; of a key given twice, the last record) in one statement, ``loaded_at``
        (unix s) on each row written; returns how many rows were inserted or changed."""
        rows = list({r["key"]: r for r in records}.values())
        written = await self.db.fetch(
            UPSERT_PROJECTS,
            [r["key"] for r in rows],
            [r["registry"] for r in rows],
            [r["country"] for r in rows],
            [r["category"] for r in rows],
            [json.dumps(r, sort_keys=True) for r in rows],
            loaded_at,
        )
        return len(written)

    async def version(self) -> tuple[int, int]:
        """(project count, sum of the rows' transaction ids): changes whenever the catalogue
        does (an insert or a changed record), and only then."""
        row = await self.db.fetchrow(CATALOGUE_VERSION)
        assert row is not None
        return int(row[0]), int(row[1])

    async def projects(self) -> list[ProjectRow]:
        return [
            ProjectRow(json.loads(r["record"]), int(r["loaded_at"]))
            for r in await self.db.fetch(ALL_PROJECTS)
        ]

    # ------------------------------------------------------------------ index

    async def cursor(self, chain_id: int, name: str) -> tuple[int, bytes | None] | None:
        """The cursor named ``name`` of chain ``chain_id``: (block number, block hash)."""
        row = await self.db.fetchrow(CURSOR, chain_id, name)
        if row is None:
            return None
        return int(row["block_number"]), None if row["block_hash"] is None else bytes(row["block_hash"])

    async def save(self, batch: IndexBatch, cursor: str, block_number: int, block_hash: bytes | None) -> None:
        """Write one range's credits, listing events (folding their listings), transfers and
        retirements, and advance ``cursor``, in one transaction (idempotent)."""
        c = batch.chain_id
        async with self.db.transaction() as conn:
            if batch.credits:
                await conn.executemany(
                    INSERT_CREDIT,
                    [
                        (
                            c,
                            batch.credit_token,
                            r.token_id,
                            r.project_key,
                            r.vintage,
                            r.registry,
                            r.block_number,
                        )
                        for r in batch.credits
                    ],
                )
            if batch.transfers:
                await conn.executemany(
                    INSERT_TRANSFER,
                    [
                        (
                            c,
                            t.block_number,
                            t.log_index,
                            t.batch_index,
                            t.tx_hash,
                            t.timestamp,
                            batch.credit_token,
                            token_id,
                            t.sender,
                            t.receiver,
                            t.amount,
                        )
                        for token_id, t in batch.transfers
                    ],
                )
            if batch.listing_events:
                await self._fold(conn, c, batch.marketplace, batch.listing_events)
            if batch.retirements:
                await conn.executemany(INSERT_RETIREMENT, [retirement_args(r) for r in batch.retirements])
            await conn.execute(ADVANCE_CURSOR, c, cursor, block_number, block_hash)

    async def _fold(
        self,
        conn: PoolConnectionProxy[asyncpg.Record],
        chain_id: int,
        marketplace: str,
        events: Sequence[ListingEvent],
    ) -> None:
        """Record the events (a replayed one is skipped) and fold each touched listing forward."""
        ids = sorted({e.listing_id for e in events})
        known = {
            int(r["listing_id"]): _listing(r)
            for r in await conn.fetch(LISTINGS_BY_ID, chain_id, marketplace, ids)
        }
        fresh: list[ListingEvent] = []
        for e in events:
            status = await conn.execute(
                INSERT_LISTING_EVENT,
                chain_id,
                e.block_number,
                e.log_index,
                e.tx_hash,
                e.block_timestamp,
                marketplace,
                e.listing_id,
                e.kind,
                json.dumps(e.data),
            )
            if status.endswith(" 1"):
                fresh.append(e)
        touched: dict[int, ListingState | None] = {}
        for e in fresh:
            state = touched.get(e.listing_id, known.get(e.listing_id))
            touched[e.listing_id] = fold_listing(state, e)
        rows = [_listing_args(chain_id, marketplace, s) for s in touched.values() if s is not None]
        if rows:
            await conn.executemany(UPSERT_LISTING, rows)

    async def rewind(
        self,
        chain_id: int,
        ancestor: int,
        ancestor_hash: bytes | None,
        cursors: Sequence[str],
        retirements: bool,
    ) -> None:
        """Undo the catalogue's index above block ``ancestor`` (and the retirements when this
        indexer owns them), rewinding ``cursors``, in one transaction."""
        async with self.db.transaction() as conn:
            await rewind_catalogue(conn, chain_id, ancestor)
            if retirements:
                await conn.execute(DELETE_RETIREMENTS, chain_id, ancestor)
            for name in cursors:
                await conn.execute(REWIND_CURSOR, chain_id, name, ancestor, ancestor_hash)

    # ------------------------------------------------------------------ live state

    async def credits(self) -> list[ChainCredit]:
        return [
            ChainCredit(
                int(r["chain_id"]),
                r["credit_token"],
                int(r["token_id"]),
                r["project_key"],
                int(r["vintage"]),
                r["registry"],
            )
            for r in await self.db.fetch(ALL_CREDITS)
        ]

    async def credit_totals(self) -> dict[tuple[int, str, int], CreditTotals]:
        rows = await self.db.fetch(CREDIT_TOTALS, ZERO_ADDRESS)
        return {
            (int(r["chain_id"]), r["credit_token"], int(r["token_id"])): CreditTotals(
                int(r["minted"]), int(r["burned"]), int(r["last_moved"] or 0)
            )
            for r in rows
        }

    async def holder_balances(self, holders: Sequence[tuple[int, str]]) -> dict[tuple[int, str, int], int]:
        """Units of each credit held by the given (chain id, address) holders together."""
        if not holders:
            return {}
        rows = await self.db.fetch(HOLDER_BALANCES, [h[0] for h in holders], [h[1] for h in holders])
        return {(int(r["chain_id"]), r["credit_token"], int(r["token_id"])): int(r["balance"]) for r in rows}

    async def live_listings(self, now: int) -> list[ChainListing]:
        return [
            ChainListing(int(r["chain_id"]), r["marketplace"], _listing(r))
            for r in await self.db.fetch(LIVE_LISTINGS, now)
        ]

    async def listing(self, chain_id: int, listing_id: int) -> ChainListing | None:
        row = await self.db.fetchrow(LISTING, chain_id, listing_id)
        return None if row is None else ChainListing(int(row["chain_id"]), row["marketplace"], _listing(row))

    async def transfers_of(
        self, chain_id: int, credit_token: str, token_id: int, up_to_block: int, limit: int = 5000
    ) -> list[Transfer]:
        """Transfers of one credit up to a block, oldest first (at most ``limit``)."""
        rows = await self.db.fetch(TRANSFERS_OF_CREDIT, chain_id, credit_token, token_id, up_to_block, limit)
        return [_transfer(r) for r in rows]


async def rewind_catalogue(conn: PoolConnectionProxy[asyncpg.Record], chain_id: int, ancestor: int) -> None:
    """Delete the catalogue rows of blocks above ``ancestor`` and fold the touched listings again
    from their remaining events (a listing created above it is gone). Runs inside the caller's
    transaction (the follower's reorg undo and the catalogue indexer's)."""
    touched = {
        (r["marketplace"], int(r["listing_id"]))
        for r in await conn.fetch(DELETE_LISTING_EVENTS, chain_id, ancestor)
    }
    await conn.execute(DELETE_TRANSFERS, chain_id, ancestor)
    await conn.execute(DELETE_CREDITS, chain_id, ancestor)
    for marketplace, listing_id in sorted(touched):
        state: ListingState | None = None
        for r in await conn.fetch(EVENTS_OF_LISTING, chain_id, marketplace, listing_id):
            event = ListingEvent(
                listing_id,
                r["kind"],
                json.loads(r["data"]),
                int(r["block_number"]),
                int(r["block_timestamp"]),
                int(r["log_index"]),
                bytes(r["tx_hash"]),
            )
            state = fold_listing(state, event)
        if state is None:
            await conn.execute(DELETE_LISTING, chain_id, marketplace, listing_id)
        else:
            await conn.execute(UPSERT_LISTING, *_listing_args(chain_id, marketplace, state))
