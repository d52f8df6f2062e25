"""The marketplace's catalogue snapshot (spec: marketplace-api.md, GET /carbonProjects,
/carbonProjects/{key}, /prices): the project records (rebuilt when the catalogue version moves;
the same records x402 discover filters by) with their filter indexes, and the live figures
folded from the index (credits, transfers, live listings), rebuilt at most every
:data:`REFRESH_S` seconds in the background while requests are served from the previous one.
Rendered answers are kept per snapshot while it shows the same.

Amounts in credit units (1000 a tonne) and USDC atomic units; times in unix seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from relayer.chain.types import Contracts
from relayer.domain.chains import display_name
from relayer.domain.projects import LiveFigures, ProjectRecord
from relayer.service.project_records import CatalogueRecords, ProjectRecords
from relayer.store.catalogue import CatalogueStore, ChainCredit, ChainListing, CreditTotals

log = logging.getLogger(__name__)

REFRESH_S: Final = 1.0
"""Oldest live figures served (seconds): the snapshot is rebuilt when older."""
STALE_LIMIT_S: Final = 30.0
"""A snapshot this old (its rebuilds failing: the database is down) is not served: a request
waits for a rebuild instead, and so answers 503 while the database stays down."""
CACHE_ENTRIES: Final = 4096
"""Rendered responses kept per snapshot (least recently used out first)."""


@dataclass(frozen=True, slots=True)
class IndexedChain:
    """A chain whose catalogue events are indexed: its id, display name and contracts."""

    chain_id: int
    contracts: Contracts

    @property
    def name(self) -> str:
        return display_name(self.chain_id)


Rendered = tuple[dict[str, str], bytes]
"""A rendered answer: its headers and JSON body."""


@dataclass(slots=True)
class Snapshot:
    """The catalogue as of ``built_at``: its records and filter indexes, live figures and listings."""

    index: CatalogueIndex
    built_at: float
    live: dict[str, LiveFigures]
    listings: dict[str, list[ChainListing]]
    credits: dict[tuple[int, str, int], ChainCredit]
    all_listings: list[ChainListing]
    cache: OrderedDict[str, Rendered] = field(default_factory=OrderedDict)
    project_json: dict[str, bytes] = field(default_factory=dict)

    @property
    def version(self) -> tuple[int, int]:
        """The catalogue version the records are of."""
        return self.index.version

    @property
    def records(self) -> dict[str, ProjectRecord]:
        """Each project's record, by project key."""
        return self.index.records

    def same_state(self, other: Snapshot) -> bool:
        """Whether ``other`` shows exactly what this one does (its rendered answers still hold)."""
        return (
            self.version == other.version
            and self.live == other.live
            and self.listings == other.listings
            and self.all_listings == other.all_listings
        )


@dataclass(frozen=True, slots=True)
class CatalogueIndex:
    """The catalogue's parsed records and their filter indexes, built once per catalogue
    version (not at every rebuild of the live figures)."""

    version: tuple[int, int]
    records: dict[str, ProjectRecord]
    loaded: dict[str, int]
    keys: list[str]
    by_country: dict[str, list[str]]
    by_category: dict[str, list[str]]
    by_both: dict[tuple[str, str], list[str]]
    lower_keys: dict[str, str]

    @classmethod
    def of(cls, catalogue: CatalogueRecords) -> CatalogueIndex:
        version, records, loaded = catalogue.version, dict(catalogue.records), dict(catalogue.loaded_at)
        keys = sorted(records)
        by_country: dict[str, list[str]] = defaultdict(list)
        by_category: dict[str, list[str]] = defaultdict(list)
        by_both: dict[tuple[str, str], list[str]] = defaultdict(list)
        for key in keys:
            r = records[key]
            by_country[r.country.lower()].append(key)
            by_category[r.category.lower()].append(key)
            by_both[(r.country.lower(), r.category.lower())].append(key)
        lower = {k.lower(): k for k in keys}
        return cls(version, records, loaded, keys, dict(by_country), dict(by_category), dict(by_both), lower)


def _cheapest_first(cl: ChainListing) -> tuple[int, int, int]:
    return (cl.state.unit_price, cl.chain_id, cl.state.listing_id)


def _live_figures(
    credits: Sequence[ChainCredit],
    totals: dict[tuple[int, str, int], CreditTotals],
    pools: dict[tuple[int, str, int], int],
    listings: dict[str, list[ChainListing]],
    loaded: dict[str, int],
) -> dict[str, LiveFigures]:
    """Each project's figures from its credits on every chain: minted, burned, held by the
    class pools, offered in live listings (credit units), the cheapest listing's price and the
    time it last changed."""
    by_project: dict[str, list[ChainCredit]] = defaultdict(list)
    for credit in credits:
        by_project[credit.project_key].append(credit)
    live: dict[str, LiveFigures] = {}
    for key, project_credits in by_project.items():
        minted = burned = pooled = 0
        moved = loaded.get(key, 0)
        for c in project_credits:
            t = totals.get((c.chain_id, c.credit_token, c.token_id))
            if t is not None:
                minted, burned, moved = minted + t.minted, burned + t.burned, max(moved, t.last_moved)
            pooled += max(0, pools.get((c.chain_id, c.credit_token, c.token_id), 0))
        offered = listings.get(key, [])
        live[key] = LiveFigures(
            minted,
            burned,
            max(0, minted - burned),
            sum(cl.state.left_to_sell for cl in offered),
            pooled,
            min((cl.state.unit_price for cl in offered), default=None),
            max([moved, *(cl.state.updated_at for cl in offered)]),
            "",
        )
    return live


def zero_figures(loaded_at: int) -> LiveFigures:
    """The figures of a project nothing on chain refers to yet."""
    return LiveFigures(0, 0, 0, 0, 0, None, loaded_at, "")


class CatalogueSnapshots:
    """Builds and serves the catalogue snapshot.

    Args:
        store: the catalogue's index (credits, transfers, listings, pools).
        project_records: the project records, shared with x402 discover.
        chains: the indexed chains (their class pools count as supply).
        clock: unix seconds.
    """

    def __init__(
        self,
        store: CatalogueStore,
        project_records: ProjectRecords,
        chains: Sequence[IndexedChain],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.project_records = project_records
        self.chains = {c.chain_id: c for c in chains}
        self.clock = clock
        self._snapshot: Snapshot | None = None
        self._records: CatalogueIndex | None = None
        self._refreshing: asyncio.Task[Snapshot] | None = None

    async def snapshot(self) -> Snapshot:
        """The current snapshot: built on first use; past :data:`REFRESH_S`, a rebuild starts in
        the background and this one is served meanwhile."""
        current = self._snapshot
        if current is None or self.clock() - current.built_at > STALE_LIMIT_S:
            return await self._refresh()
        if self.clock() - current.built_at > REFRESH_S and self._refreshing is None:
            self._refreshing = asyncio.create_task(self._refresh())
            self._refreshing.add_done_callback(_log_failure)
        return current

    async def _refresh(self) -> Snapshot:
        try:
            snap = await self._build()
            previous = self._snapshot
            if previous is not None and snap.same_state(previous):  # nothing moved: keep what is rendered
                snap.cache, snap.project_json = previous.cache, previous.project_json
            self._snapshot = snap
            return snap
        finally:
            self._refreshing = None

    async def _build(self) -> Snapshot:
        now = int(self.clock())
        catalogue = await self.project_records.current()  # the records discover filters by too
        version = catalogue.version
        if self._records is None or self._records.version != version:
            self._records = CatalogueIndex.of(catalogue)
        records = self._records
        credits_list, totals, live_listings = await asyncio.gather(
            self.store.credits(), self.store.credit_totals(), self.store.live_listings(now)
        )
        pools = await self.store.holder_balances(
            [(c.chain_id, c.contracts.carbon_classes) for c in self.chains.values()]
        )
        credits = {(c.chain_id, c.credit_token, c.token_id): c for c in credits_list}
        ordered = sorted(live_listings, key=_cheapest_first)
        listings: dict[str, list[ChainListing]] = defaultdict(list)
        for cl in ordered:
            listed = credits.get((cl.chain_id, cl.state.credit_token, cl.state.token_id))
            if listed is not None:
                listings[listed.project_key].append(cl)
        live = _live_figures(credits_list, totals, pools, listings, records.loaded)
        return Snapshot(records, self.clock(), live, dict(listings), credits, ordered)


def remember(snap: Snapshot, key: str, rendered: Rendered) -> None:
    """Keep a rendered answer while the catalogue shows the same (at most
    :data:`CACHE_ENTRIES`, the least recently used out first)."""
    snap.cache[key] = rendered
    if len(snap.cache) > CACHE_ENTRIES:
        snap.cache.popitem(last=False)


def recall(snap: Snapshot, key: str) -> Rendered | None:
    """A rendered answer kept by :func:`remember` (marked recently used)."""
    hit = snap.cache.get(key)
    if hit is not None:
        snap.cache.move_to_end(key)
    return hit


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("catalogue refresh failed", extra={"error": type(task.exception()).__name__})
