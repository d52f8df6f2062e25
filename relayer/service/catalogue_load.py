"""Loading carbon projects into the marketplace catalogue: a ``carbon-projects.json``-shaped
file checked strictly, then written :data:`CATALOGUE_CHUNK` records a transaction (upserts,
so a repeated or concurrent load is harmless). Used by ``relayer catalogue load`` and by the
start of a daemon, which seeds an empty catalogue from ``RELAYER_PROJECTS_FILE``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from relayer.config import ConfigError, Settings
from relayer.domain.projects import parse_record
from relayer.store.catalogue import CatalogueStore

log = logging.getLogger(__name__)

CATALOGUE_CHUNK: Final = 500
"""Projects written per database transaction."""


def parse_catalogue(data: bytes) -> list[dict[str, Any]]:
    """The project records of a ``carbon-projects.json``-shaped file, each checked strictly
    (see :func:`relayer.domain.projects.parse_record`); unique keys.

    Raises:
        ConfigError: not a JSON array, or a record is malformed (naming its position and key).
    """
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ConfigError(message=f"the catalogue file is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise ConfigError(message="the catalogue file must hold a JSON array of project records")
    seen: set[str] = set()
    for position, record in enumerate(raw):
        try:
            key = parse_record(record).key
        except ValueError as exc:
            raise ConfigError(message=f"catalogue record {position}: {exc}") from None
        if key in seen:
            raise ConfigError(message=f"catalogue record {position}: key {key} appears twice")
        seen.add(key)
    return raw


def projects_file_records(settings: Settings) -> list[dict[str, Any]]:
    """The records of ``RELAYER_PROJECTS_FILE`` (default: the packaged data set of 648 real
    projects), checked as :func:`parse_catalogue` checks them.

    Raises:
        ConfigError: the file cannot be read or is not a usable catalogue (naming the setting).
    """
    try:
        return parse_catalogue(settings.projects())
    except OSError as exc:
        raise ConfigError(message=f"RELAYER_PROJECTS_FILE is not usable: {type(exc).__name__}") from None
    except ConfigError as exc:
        raise ConfigError(message=f"RELAYER_PROJECTS_FILE is not usable: {exc.message}") from None


async def load_projects(
    store: CatalogueStore,
    records: list[dict[str, Any]],
    loaded_at: int,
    progress: Callable[[int], None] = lambda _n: None,
) -> int:
    """Insert or update ``records`` (checked by :func:`parse_catalogue`) as loaded at
    ``loaded_at`` (unix seconds), :data:`CATALOGUE_CHUNK` a transaction, calling
    ``progress(n)`` after each chunk; returns how many rows changed.

    Raises:
        StoreUnavailable: the database failed (the chunks written so far stay).
    """
    changed = 0
    for start in range(0, len(records), CATALOGUE_CHUNK):
        chunk = records[start : start + CATALOGUE_CHUNK]
        changed += await store.load_projects(chunk, loaded_at)
        progress(len(chunk))
    return changed


async def seed_catalogue(store: CatalogueStore, settings: Settings) -> None:
    """An empty catalogue gets the projects of ``RELAYER_PROJECTS_FILE`` (default: the
    packaged 648 real projects), so a fresh deployment's marketplace API is not empty; later
    changes come from ``relayer catalogue load``. Concurrent starts are harmless (upserts).

    Raises:
        ConfigError: the projects file is unusable.
        StoreUnavailable: the database failed.
    """
    if (await store.version())[0] > 0:
        return
    records = projects_file_records(settings)
    await load_projects(store, records, int(time.time()))
    log.info("catalogue seeded", extra={"projects": len(records)})
