"""The catalogue's project records, one model for every reader: x402 discover's project filters
(country, category, methodology) and the marketplace's projects read the records of the
catalogue database (``relayer catalogue load`` writes them), parsed once per catalogue version.

Naming: a record's ``key`` (``VCS-10``) is what a credit on chain names as its project and what
x402 discover answers as ``projectId``; the marketplace answers it as ``key`` and the registry's
number (``10``, the record's ``project_id``) as ``projectID``. Wire names are the specs'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from relayer.domain.projects import ProjectRecord, parse_record
from relayer.store.catalogue import CatalogueStore, ProjectRow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CatalogueRecords:
    """The catalogue as of one version: parsed records by key and when each was loaded (unix s).
    A row that no longer parses (loaded by an older release's rules) is left out."""

    version: tuple[int, int]
    records: Mapping[str, ProjectRecord]
    loaded_at: Mapping[str, int]

    @classmethod
    def of(cls, version: tuple[int, int], rows: list[ProjectRow]) -> CatalogueRecords:
        """Parse ``rows``; a malformed one is skipped with a warning (its reason, bounded)."""
        records: dict[str, ProjectRecord] = {}
        loaded: dict[str, int] = {}
        for row in rows:
            try:
                record = parse_record(row.record)
            except ValueError as exc:
                log.warning("catalogue record skipped", extra={"reason": str(exc)[:200]})
                continue
            records[record.key] = record
            loaded[record.key] = row.loaded_at
        return cls(version, MappingProxyType(records), MappingProxyType(loaded))


class ProjectRecords:
    """The catalogue's records, reloaded when :meth:`CatalogueStore.version` moves.

    One instance is shared by discover and the marketplace so both see the same catalogue and
    the records are parsed once per version. Concurrent callers share one check.
    """

    def __init__(self, store: CatalogueStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._current: CatalogueRecords | None = None
        self._checked_at = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def latest(self) -> Mapping[str, ProjectRecord]:
        """The records of the last :meth:`current` (none before the first), without I/O."""
        return self._current.records if self._current is not None else MappingProxyType({})

    async def current(self, max_age_s: float = 0.0) -> CatalogueRecords:
        """The records of the catalogue's current version.

        Args:
            max_age_s: seconds a version check stays good: within them the records of the last
                check are returned without asking the database (0: always ask).

        Raises:
            StoreUnavailable: the database failed (the next call asks again).
        """
        current = self._current
        if current is not None and self.clock() - self._checked_at < max_age_s:
            return current
        async with self._lock:
            current = self._current
            if current is not None and self.clock() - self._checked_at < max_age_s:
                return current  # another caller checked while this one waited
            version = await self.store.version()
            if current is None or current.version != version:
                current = CatalogueRecords.of(version, await self.store.projects())
                self._current = current
            self._checked_at = self.clock()
            return current
