"""The operator's one-shot writes behind the command line: ``relayer catalogue load`` (the
catalogue's projects) and ``relayer apikey create|list|revoke|rotate`` (API keys of the
marketplace and the x402 facilitator). Each opens a one-connection pool on
``RELAYER_DATABASE_URL``, does its one job and closes it."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from relayer.config import Settings, check_rate_limit
from relayer.service.catalogue_load import load_projects
from relayer.service.market.keys import API_KEY_PREFIX, SCOPES
from relayer.service.startup import open_database
from relayer.store.catalogue import CatalogueStore
from relayer.store.orders import ListedKey, Orders
from relayer.store.pool import Database


@contextlib.asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[Database]:
    """A one-connection pool on ``RELAYER_DATABASE_URL``, closed on the way out."""
    assert settings.database_url is not None
    db = await open_database(settings.database_url.get_secret_value())
    try:
        yield db
    finally:
        await db.close()


async def load_catalogue(
    settings: Settings, records: list[dict[str, Any]], progress: Callable[[int], None]
) -> int:
    """Insert or update ``records`` (checked by
    :func:`relayer.service.catalogue_load.parse_catalogue`) in the catalogue, a chunk a
    transaction, calling ``progress(n)`` after each chunk; returns how many rows changed.

    Raises:
        StoreUnavailable: the database failed (the chunks written so far stay).
    """
    async with _database(settings) as db:
        return await load_projects(CatalogueStore(db), records, int(time.time()), progress)


async def create_api_key(
    settings: Settings,
    name: str,
    scopes: Sequence[str] = ("marketplace",),
    rate_limit: str | None = None,
    gas_budget_wei_per_day: int | None = None,
) -> str:
    """A new API key (bearer token) named ``name`` (at most its first 100 characters kept)
    with ``scopes`` (``marketplace``: quotes and orders; ``facilitator``: /facilitator/verify
    and /settle), a facilitator rate limit (``limits`` notation, e.g. ``"50/second"``) and a
    daily gas budget in wei (None: the settings' defaults); only its SHA-256 is stored.

    Raises:
        ValueError: an unknown scope, no scope, a malformed rate limit or a negative budget.
        StoreUnavailable: the database failed.
    """
    unknown = set(scopes) - set(SCOPES)
    if unknown or not scopes:
        raise ValueError(f"scopes are {', '.join(SCOPES)}; got {sorted(unknown) or 'none'}")
    if rate_limit is not None:
        check_rate_limit(rate_limit)
    if gas_budget_wei_per_day is not None and gas_budget_wei_per_day < 0:
        raise ValueError("the gas budget is a number of wei, at least 0")
    async with _database(settings) as db:
        prefix, token = _new_token()
        await Orders(db).add_key(
            hashlib.sha256(token.encode()).digest(),
            prefix,
            name[:100],
            sorted(set(scopes)),
            rate_limit,
            gas_budget_wei_per_day,
        )
        return token


def _new_token() -> tuple[str, str]:
    """A fresh bearer token ``mk_<12 hex>_<43 url-safe characters>`` and its public prefix."""
    prefix = secrets.token_hex(6)
    return prefix, f"{API_KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"


async def list_api_keys(settings: Settings) -> list[ListedKey]:
    """Every API key, revoked ones too, oldest first (``relayer apikey list``): never a hash
    or a secret.

    Raises:
        StoreUnavailable: the database failed.
    """
    async with _database(settings) as db:
        return await Orders(db).keys()


async def revoke_api_key(settings: Settings, key_id: int) -> ListedKey | None:
    """Revoke API key ``key_id`` (``relayer apikey revoke``): every process looks keys up in
    the database on each request, so its next request is refused (401). The key as it stands
    now (None: no such key; ``revoked_at`` set, by this call or an earlier one).

    Raises:
        StoreUnavailable: the database failed.
    """
    async with _database(settings) as db:
        orders = Orders(db)
        await orders.revoke_key(key_id)
        return await orders.key(key_id)


async def rotate_api_key(settings: Settings, key_id: int) -> tuple[ListedKey, str]:
    """Replace live API key ``key_id`` by a new token with the same name, scopes, rate limit
    and gas budget, revoking the old one in the same statement (``relayer apikey rotate``):
    (the new key, its token, shown once). The new key's daily gas budget starts afresh.

    Raises:
        LookupError: ``key_id`` is not a live key (nothing changed).
        StoreUnavailable: the database failed.
    """
    async with _database(settings) as db:
        orders = Orders(db)
        prefix, token = _new_token()
        new_id = await orders.rotate_key(key_id, hashlib.sha256(token.encode()).digest(), prefix)
        listed = None if new_id is None else await orders.key(new_id)
        if listed is None:
            raise LookupError(f"API key {key_id} is not a live key (see relayer apikey list)")
        return listed, token
