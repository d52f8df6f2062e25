"""Bearer API keys (stored as SHA-256 hashes only), single-use marketplace quotes and orders
(each retired through one relay job). Amounts: credit units and USDC atomic units; times:
unix seconds. Every method raises ``StoreUnavailable`` when the database fails."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from relayer.domain.errors import RelayerError
from relayer.store.pool import Database

# Register an API key by its hash, with its scopes, rate limit and daily gas budget (NULL: the
# settings' defaults).
INSERT_KEY: Final = """
INSERT INTO api_keys (key_hash, prefix, name, scopes, rate_limit, gas_budget_wei_per_day)
VALUES ($1, $2, $3, $4::text[], $5, $6) RETURNING id
"""
# The live key whose token hashes to $1 (SHA-256; unique): the lookup costs the same whether or
# not a key of the token's public prefix exists (issue 35: a lookup by prefix told by its time).
KEY_BY_HASH: Final = """
SELECT id, key_hash, name, scopes, rate_limit, gas_budget_wei_per_day FROM api_keys
WHERE key_hash = $1 AND revoked_at IS NULL
"""
# Every key, oldest first, for the operator (relayer apikey list): never a hash or a secret.
KEYS: Final = """
SELECT id, prefix, name, scopes, rate_limit, gas_budget_wei_per_day, created_at, last_used_at, revoked_at
FROM api_keys ORDER BY id LIMIT $1
"""
KEY: Final = """
SELECT id, prefix, name, scopes, rate_limit, gas_budget_wei_per_day, created_at, last_used_at, revoked_at
FROM api_keys WHERE id = $1
"""
# Revoke key $1 (a key revoked already keeps its first revocation time); its id when it was live.
REVOKE_KEY: Final = "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING id"
# Rotate key $1: revoke it and register the token hashed $2 (public prefix $3) with its name,
# scopes, rate limit and gas budget, in one statement; the new key's id (none: $1 was not live).
ROTATE_KEY: Final = """
WITH old AS (
    UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
    RETURNING name, scopes, rate_limit, gas_budget_wei_per_day
)
INSERT INTO api_keys (key_hash, prefix, name, scopes, rate_limit, gas_budget_wei_per_day)
SELECT $2, $3, name, scopes, rate_limit, gas_budget_wei_per_day FROM old RETURNING id
"""
# Key $1 was used now (written at most once a minute per key and process by the caller).
TOUCH_KEY: Final = "UPDATE api_keys SET last_used_at = now() WHERE id = $1"
INSERT_QUOTE: Final = """
INSERT INTO quotes (uuid, api_key_id, chain_id, marketplace, listing_id, quantity_units, unit_price,
                    cost_usdc, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""
_QUOTE_COLUMNS: Final = (
    "uuid, api_key_id, chain_id, marketplace, listing_id, quantity_units, unit_price, cost_usdc, created_at, "
    "expires_at, consumed_at"
)
QUOTE: Final = f"SELECT {_QUOTE_COLUMNS} FROM quotes WHERE uuid = $1 AND api_key_id = $2"
# Consume quote $1 of key $2 if it is unspent and unexpired at $3; then record the order.
CONSUME_QUOTE: Final = f"""
UPDATE quotes SET consumed_at = $3
WHERE uuid = $1 AND api_key_id = $2 AND consumed_at IS NULL AND expires_at > $3
RETURNING {_QUOTE_COLUMNS}
"""
INSERT_ORDER: Final = """
INSERT INTO orders (id, quote_uuid, api_key_id, beneficiary_name, beneficiary_address, retirement_message,
                    consumption_metadata, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $8)
"""
# A job found for the order is the truth: it clears an error an earlier attempt recorded.
SET_ORDER_JOB: Final = "UPDATE orders SET job_id = $2, error = NULL, updated_at = $3 WHERE id = $1"
# An order that has a job never fails by an attempt's error (its job's state says how it ends).
SET_ORDER_ERROR: Final = (
    "UPDATE orders SET error = $2::jsonb, updated_at = $3 WHERE id = $1 AND job_id IS NULL AND error IS NULL"
)
_ORDER_SELECT: Final = f"""
SELECT o.id, o.quote_uuid, o.job_id, o.beneficiary_name, o.beneficiary_address, o.retirement_message,
       o.consumption_metadata::text AS consumption_metadata,
       o.error::text AS error, o.created_at, o.updated_at, j.state, j.tx_hash, j.error::text AS job_error,
       {", ".join("q." + c.strip() + " AS q_" + c.strip() for c in _QUOTE_COLUMNS.split(","))}
FROM orders o JOIN quotes q ON q.uuid = o.quote_uuid LEFT JOIN relay_jobs j ON j.id = o.job_id
"""
# An order of key $2 with its job's state and transaction, if any.
ORDER: Final = _ORDER_SELECT + "WHERE o.id = $1 AND o.api_key_id = $2"
# Orders recorded before $1 that have neither a job nor an error: their attempt did not finish
# (an outage, or the process died between recording the order and its job). Oldest first.
PENDING_ORDERS: Final = (
    _ORDER_SELECT
    + "WHERE o.job_id IS NULL AND o.error IS NULL AND o.created_at < $1 AND q.chain_id = $3 "
    + "ORDER BY o.created_at LIMIT $2"
)


@dataclass(frozen=True, slots=True)
class Quote:
    """A marketplace quote: ``quantity_units`` of listing ``listing_id`` at ``unit_price``
    (USDC atomic per tonne) for ``cost_usdc`` (atomic), valid until ``expires_at``."""

    uuid: uuid.UUID
    api_key_id: int
    chain_id: int
    marketplace: str
    listing_id: int
    quantity_units: int
    unit_price: int
    cost_usdc: int
    created_at: int
    expires_at: int
    consumed_at: int | None


@dataclass(frozen=True, slots=True)
class Order:
    """An order and where its relay job stands (``job_state`` None before it has one)."""

    id: uuid.UUID
    quote: Quote
    job_id: int | None
    beneficiary_name: str
    beneficiary_address: str
    retirement_message: str
    error: dict[str, Any] | None
    created_at: int
    updated_at: int
    job_state: str | None
    tx_hash: bytes | None
    job_error: dict[str, Any] | None = None  # the relay job's error (``code``, ``message``) when it failed
    consumption_metadata: dict[str, str] | None = None

    @property
    def pending(self) -> bool:
        """Recorded, but neither handed to the relay (no job) nor failed: an attempt is due."""
        return self.job_id is None and self.error is None


def _quote(row: asyncpg.Record, prefix: str = "") -> Quote:
    consumed = row[prefix + "consumed_at"]
    return Quote(
        row[prefix + "uuid"],
        int(row[prefix + "api_key_id"]),
        int(row[prefix + "chain_id"]),
        row[prefix + "marketplace"],
        int(row[prefix + "listing_id"]),
        int(row[prefix + "quantity_units"]),
        int(row[prefix + "unit_price"]),
        int(row[prefix + "cost_usdc"]),
        int(row[prefix + "created_at"]),
        int(row[prefix + "expires_at"]),
        None if consumed is None else int(consumed),
    )


@dataclass(frozen=True, slots=True)
class StoredKey:
    """An API key as stored: its id, the SHA-256 of its token, its name, its scopes
    (``marketplace``, ``facilitator``), its rate limit (``limits`` notation) and daily gas
    budget (wei), each None for the settings' default."""

    id: int
    key_hash: bytes
    name: str
    scopes: frozenset[str]
    rate_limit: str | None
    gas_budget_wei_per_day: int | None


@dataclass(frozen=True, slots=True)
class ListedKey:
    """An API key as the operator sees it (``relayer apikey list``): never its hash or secret.
    ``prefix`` is the token's public part (``mk_<prefix>_...``); the rate limit (``limits``
    notation) and gas budget (wei per UTC day) are None for the settings' defaults; times are
    timezone-aware (None: never used, not revoked)."""

    id: int
    prefix: str
    name: str
    scopes: tuple[str, ...]
    rate_limit: str | None
    gas_budget_wei_per_day: int | None
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None


def _listed(r: Any) -> ListedKey:
    return ListedKey(
        int(r["id"]),
        r["prefix"],
        r["name"],
        tuple(r["scopes"]),
        r["rate_limit"],
        None if r["gas_budget_wei_per_day"] is None else int(r["gas_budget_wei_per_day"]),
        r["created_at"],
        r["last_used_at"],
        r["revoked_at"],
    )


class QuoteSpent(RelayerError):
    """The quote is unknown to this key, already consumed, or expired (409 ``quote_consumed``)."""

    default_code = "quote_consumed"


class Orders:
    """Repository of API keys, quotes and orders."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def add_key(
        self,
        key_hash: bytes,
        prefix: str,
        name: str,
        scopes: Sequence[str] = ("marketplace",),
        rate_limit: str | None = None,
        gas_budget_wei_per_day: int | None = None,
    ) -> int:
        """Register a key by its SHA-256 ``key_hash``; ``rate_limit`` (``limits`` notation) and
        ``gas_budget_wei_per_day`` None take the settings' defaults when used. Returns its id."""
        return int(
            await self.db.fetchval(
                INSERT_KEY, key_hash, prefix, name, list(scopes), rate_limit, gas_budget_wei_per_day
            )
        )

    async def key_by_hash(self, key_hash: bytes) -> StoredKey | None:
        """The live API key whose token's SHA-256 is ``key_hash`` (None: unknown or revoked;
        the token itself is never stored)."""
        r = await self.db.fetchrow(KEY_BY_HASH, key_hash)
        if r is None:
            return None
        return StoredKey(
            int(r["id"]),
            bytes(r["key_hash"]),
            r["name"],
            frozenset(r["scopes"]),
            r["rate_limit"],
            None if r["gas_budget_wei_per_day"] is None else int(r["gas_budget_wei_per_day"]),
        )

    async def keys(self, limit: int = 10_000) -> list[ListedKey]:
        """Every API key (revoked ones too), oldest first, at most ``limit``."""
        return [_listed(r) for r in await self.db.fetch(KEYS, limit)]

    async def key(self, key_id: int) -> ListedKey | None:
        """API key ``key_id`` as listed (None: no such key)."""
        r = await self.db.fetchrow(KEY, key_id)
        return None if r is None else _listed(r)

    async def revoke_key(self, key_id: int) -> bool:
        """Revoke key ``key_id`` at once (every request looks keys up here); False when it was
        revoked already or does not exist."""
        return await self.db.fetchval(REVOKE_KEY, key_id) is not None

    async def rotate_key(self, key_id: int, key_hash: bytes, prefix: str) -> int | None:
        """Revoke live key ``key_id`` and register the token hashed ``key_hash`` in its place
        (same name, scopes, rate limit and gas budget), atomically; the new key's id, None when
        ``key_id`` is not a live key (nothing changed)."""
        new_id = await self.db.fetchval(ROTATE_KEY, key_id, key_hash, prefix)
        return None if new_id is None else int(new_id)

    async def touch_key(self, key_id: int) -> None:
        """Record that key ``key_id`` was used now."""
        await self.db.execute(TOUCH_KEY, key_id)

    async def add_quote(self, q: Quote) -> None:
        await self.db.execute(
            INSERT_QUOTE,
            q.uuid,
            q.api_key_id,
            q.chain_id,
            q.marketplace,
            q.listing_id,
            q.quantity_units,
            q.unit_price,
            q.cost_usdc,
            q.created_at,
            q.expires_at,
        )

    async def quote(self, quote_uuid: uuid.UUID, api_key_id: int) -> Quote | None:
        row = await self.db.fetchrow(QUOTE, quote_uuid, api_key_id)
        return None if row is None else _quote(row)

    async def place(
        self,
        order_id: uuid.UUID,
        quote_uuid: uuid.UUID,
        api_key_id: int,
        beneficiary_name: str,
        beneficiary_address: str,
        message: str,
        consumption: dict[str, Any] | None,
        now: int,
    ) -> Quote:
        """Consume the quote and record the order in one transaction.

        Raises:
            QuoteSpent: the quote is not this key's, was consumed, or expired at ``now``.
        """
        async with self.db.transaction() as conn:
            row = await conn.fetchrow(CONSUME_QUOTE, quote_uuid, api_key_id, now)
            if row is None:
                raise QuoteSpent
            await conn.execute(
                INSERT_ORDER,
                order_id,
                quote_uuid,
                api_key_id,
                beneficiary_name,
                beneficiary_address,
                message,
                None if consumption is None else json.dumps(consumption),
                now,
            )
        return _quote(row)

    async def set_job(self, order_id: uuid.UUID, job_id: int, now: int) -> None:
        await self.db.execute(SET_ORDER_JOB, order_id, job_id, now)

    async def set_error(self, order_id: uuid.UUID, error: dict[str, Any], now: int) -> None:
        await self.db.execute(SET_ORDER_ERROR, order_id, json.dumps(error), now)

    async def order(self, order_id: uuid.UUID, api_key_id: int) -> Order | None:
        """Order ``order_id`` if it is key ``api_key_id``'s, with its job's state."""
        row = await self.db.fetchrow(ORDER, order_id, api_key_id)
        return None if row is None else _order(row)

    async def pending(self, chain_id: int, recorded_before: int, limit: int) -> list[Order]:
        """At most ``limit`` orders on ``chain_id`` recorded before ``recorded_before`` (unix
        seconds) with neither a job nor an error, oldest first: those whose attempt did not
        finish (each chain's order keeper takes its own)."""
        rows = await self.db.fetch(PENDING_ORDERS, recorded_before, limit, chain_id)
        return [_order(row) for row in rows]


def _order(row: asyncpg.Record) -> Order:
    consumption = row["consumption_metadata"]
    return Order(
        row["id"],
        _quote(row, "q_"),
        None if row["job_id"] is None else int(row["job_id"]),
        row["beneficiary_name"],
        row["beneficiary_address"],
        row["retirement_message"],
        None if row["error"] is None else json.loads(row["error"]),
        int(row["created_at"]),
        int(row["updated_at"]),
        row["state"],
        None if row["tx_hash"] is None else bytes(row["tx_hash"]),
        None if row["job_error"] is None else json.loads(row["job_error"]),
        None if consumption is None else json.loads(consumption),
    )
