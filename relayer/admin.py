"""The operator's one-shot writes behind the command line: ``relayer catalogue load`` (the
catalogue's projects) and ``relayer apikey create`` (an API key of the marketplace or the
x402 facilitator). Each opens a one-connection pool on ``RELAYER_DATABASE_URL``, does its
one job and closes it."""

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
from relayer.store.catalogue import CatalogueStore
from relayer.store.orders import Orders
from relayer.store.pool import Database


@contextlib.asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[Database]:
    """A one-connection pool on ``RELAYER_DATABASE_URL``, closed on the way out."""
    assert settings.database_url is not None
    db = await Database.connect(settings.database_url.get_secret_value(), 1, 1)
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
        prefix = secrets.token_hex(6)
        token = f"{API_KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
        await Orders(db).add_key(
            hashlib.sha256(token.encode()).digest(),
            prefix,
            name[:100],
            sorted(set(scopes)),
            rate_limit,
            gas_budget_wei_per_day,
        )
        return token
