"""The marketplace catalogue API's service (spec: marketplace-api.md, release v18) over the
shared store and indexer: categories, carbon projects with live figures and listings,
retirements on every indexed chain with provenance and certificate, seller listing prices,
single-use quotes and orders that retire from the operator's treasury through the relay.

Reads of the catalogue come from an in-memory snapshot: the project records (reloaded when the
catalogue changes) and the live figures folded from the index (credits, transfers, live
listings), rebuilt at most every :data:`REFRESH_S` seconds, in the background while requests
are served from the previous one. Rendered pages are cached per snapshot.

Amounts: credit units (1000 a tonne) and USDC atomic units inside, decimal strings outside;
times in unix seconds. Refusals are :class:`~relayer.domain.errors.Rejection`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from relayer.chain.signer import TreasurySigner
from relayer.chain.types import Contracts
from relayer.domain.amounts import format_tonnes, tonnes_ceil_units
from relayer.domain.chains import display_name, explorer_tx_url
from relayer.domain.errors import Rejection
from relayer.domain.marketplace import (
    ZERO_ADDRESS,
    CarbonProjectsQuery,
    OrderRequest,
    PricesQuery,
    QuoteRequest,
    RetirementId,
    RetirementsQuery,
    SourceId,
    Transfer,
    bad_request,
    not_found,
    price_units,
    provenance,
    usdc,
)
from relayer.domain.projects import CATEGORIES, LiveFigures, ProjectRecord, project_resource
from relayer.domain.states import JobState
from relayer.service.catalog import Catalog
from relayer.service.documents import CertificateView
from relayer.service.market.orders import OrderDesk
from relayer.service.prepare import Prepare
from relayer.service.project_records import CatalogueRecords, ProjectRecords
from relayer.service.relay import Relay
from relayer.store.catalogue import CatalogueStore, ChainCredit, ChainListing, CreditTotals
from relayer.store.orders import Orders
from relayer.store.retirements import IndexedRetirement, RetirementStore

log = logging.getLogger(__name__)

REFRESH_S: Final = 1.0
"""Oldest live figures served (seconds): the snapshot is rebuilt when older."""
STALE_LIMIT_S: Final = 30.0
"""A snapshot this old (its rebuilds failing: the database is down) is not served: a request
waits for a rebuild instead, and so answers 503 while the database stays down."""
CACHE_ENTRIES: Final = 4096
"""Rendered responses kept per snapshot (least recently used out first)."""
API_KEY_PREFIX: Final = "mk_"

ORDER_STATUS: Final = {
    JobState.ACCEPTED.value: "SUBMITTED",
    JobState.SIMULATED.value: "INITIATED",
    JobState.SIGNED.value: "INITIATED",
    JobState.SUBMITTED.value: "COMMITTED",
    JobState.MINED.value: "COMMITTED",
    JobState.CONFIRMED.value: "MINTED",
    JobState.INDEXED.value: "COMPLETED",
    JobState.REJECTED.value: "FAILED",
    JobState.REVERTED.value: "FAILED",
    JobState.DROPPED.value: "FAILED",
}
"""An order's status (the public API's SUBMITTED … COMPLETED, FAILED) from its relay job's state."""


@dataclass(frozen=True, slots=True)
class IndexedChain:
    """A chain whose catalogue events are indexed: its id, display name and contracts."""

    chain_id: int
    contracts: Contracts

    @property
    def name(self) -> str:
        return display_name(self.chain_id)


@dataclass(slots=True)
class Page:
    """One page of a list: the items and how many match in all."""

    items: list[dict[str, Any]]
    total: int
    offset: int
    limit: int


Rendered = tuple[dict[str, str], bytes]
"""A rendered answer: its headers and JSON body."""


@dataclass(slots=True)
class Snapshot:
    """The catalogue as of ``built_at``: records, indexes by filter, live figures and listings."""

    version: tuple[int, int]
    built_at: float
    records: dict[str, ProjectRecord]
    loaded_at: dict[str, int]
    keys: list[str]
    by_country: dict[str, list[str]]
    by_category: dict[str, list[str]]
    by_both: dict[tuple[str, str], list[str]]
    live: dict[str, LiveFigures]
    listings: dict[str, list[ChainListing]]
    credits: dict[tuple[int, str, int], ChainCredit]
    all_listings: list[ChainListing]
    lower_keys: dict[str, str] = field(default_factory=dict)
    cache: OrderedDict[str, Rendered] = field(default_factory=OrderedDict)
    project_json: dict[str, bytes] = field(default_factory=dict)

    def same_state(self, other: Snapshot) -> bool:
        """Whether ``other`` shows exactly what this one does (its rendered answers still hold)."""
        return (
            self.version == other.version
            and self.live == other.live
            and self.listings == other.listings
            and self.all_listings == other.all_listings
        )


@dataclass(frozen=True, slots=True)
class _Records:
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
    def of(cls, catalogue: CatalogueRecords) -> _Records:
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


def _zero(loaded_at: int) -> LiveFigures:
    return LiveFigures(0, 0, 0, 0, 0, None, loaded_at, "")


class Marketplace:
    """The catalogue API's operations."""

    def __init__(
        self,
        store: CatalogueStore,
        retirements: RetirementStore,
        orders: Orders,
        catalog: Catalog,
        prepare: Prepare,
        relay: Relay,
        chains: Sequence[IndexedChain],
        public_base_url: str,
        quote_lifetime_s: int,
        treasury: TreasurySigner | None,
        clock: Callable[[], float] = time.time,
        project_records: ProjectRecords | None = None,
    ) -> None:
        self.store = store
        self.project_records = project_records or ProjectRecords(store)
        self.retirements = retirements
        self.orders = orders
        self.catalog = catalog
        self.prepare = prepare
        self.relay = relay
        self.chains = {c.chain_id: c for c in chains}
        self.relay_chain_id = catalog.chain_id
        self.public_base_url = public_base_url
        self.quote_lifetime_s = quote_lifetime_s
        self.treasury = treasury
        self.clock = clock
        self._snapshot: Snapshot | None = None
        self._records: _Records | None = None
        self._refreshing: asyncio.Task[Snapshot] | None = None
        self.desk = OrderDesk(
            store,
            orders,
            retirements,
            catalog,
            prepare,
            relay,
            treasury,
            quote_lifetime_s,
            public_base_url,
            clock,
        )

    # ------------------------------------------------------------------ snapshot

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
            self._records = _Records.of(catalogue)
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
        return Snapshot(
            version,
            self.clock(),
            records.records,
            records.loaded,
            records.keys,
            records.by_country,
            records.by_category,
            records.by_both,
            live,
            dict(listings),
            credits,
            ordered,
            records.lower_keys,
        )

    # ------------------------------------------------------------------ categories and projects

    @staticmethod
    def categories() -> list[dict[str, str]]:
        """Every methodology category (spec: GET /categories; the authority on allowed values)."""
        return [{"id": c} for c in CATEGORIES]

    def project_page(self, snap: Snapshot, q: CarbonProjectsQuery) -> Page:
        """GET /carbonProjects: the projects matching every filter given, by key, one page.

        Raises:
            Rejection: 400 ``invalid_category`` naming the allowed values.
        """
        keys = self._keys(snap, q)
        page = keys[q.offset : q.offset + q.limit]
        return Page([self.project(snap, k) for k in page], len(keys), q.offset, q.limit)

    def _keys(self, snap: Snapshot, q: CarbonProjectsQuery) -> list[str]:
        """The keys of the projects matching every filter of ``q``, in key order (400
        ``invalid_category`` for an unknown category)."""
        category = None
        if q.category is not None:
            category = next((c for c in CATEGORIES if c.lower() == q.category.lower()), None)
            if category is None:
                raise bad_request(
                    "invalid_category",
                    f"unknown category {q.category!r}; allowed values are those of GET /categories",
                    allowed=list(CATEGORIES),
                )
        if q.country is not None and category is not None:
            keys = snap.by_both.get((q.country.lower(), category.lower()), [])
        elif q.country is not None:
            keys = snap.by_country.get(q.country.lower(), [])
        elif category is not None:
            keys = snap.by_category.get(category.lower(), [])
        else:
            keys = snap.keys
        if any(
            v is not None
            for v in (q.search, q.vintage, q.sdg, q.registry, q.minSupply, q.minPriceUSD, q.maxPriceUSD)
        ):
            keys = [k for k in keys if self._matches(snap, snap.records[k], q)]
        return keys

    def project_page_json(self, snap: Snapshot, q: CarbonProjectsQuery) -> tuple[bytes, int]:
        """:meth:`project_page` as a JSON array (each project rendered once per snapshot) and
        how many projects match."""
        keys = self._keys(snap, q)
        rendered = []
        for key in keys[q.offset : q.offset + q.limit]:
            body = snap.project_json.get(key)
            if body is None:
                body = snap.project_json[key] = _json_bytes(self.project(snap, key))
            rendered.append(body)
        return b"[" + b",".join(rendered) + b"]", len(keys)

    @staticmethod
    def _matches(snap: Snapshot, r: ProjectRecord, q: CarbonProjectsQuery) -> bool:
        if q.registry is not None and r.registry.lower() != q.registry.lower():
            return False
        if q.vintage is not None and q.vintage not in r.vintages:
            return False
        if q.sdg is not None and q.sdg not in r.sdgs:
            return False
        if q.search is not None:
            needle = q.search.lower()
            if not any(needle in s.lower() for s in (r.key, r.name, r.description, r.country)):
                return False
        live = snap.live.get(r.key)
        if q.minSupply is not None:
            supply = 0 if live is None else live.listings_units + live.pools_units
            if supply < tonnes_ceil_units(q.minSupply):
                return False
        if q.minPriceUSD is not None or q.maxPriceUSD is not None:
            price = None if live is None else live.min_listing_price
            if price is None:
                return False
            if q.minPriceUSD is not None and price < price_units(q.minPriceUSD):
                return False
            if q.maxPriceUSD is not None and price > price_units(q.maxPriceUSD):
                return False
        return True

    def project(self, snap: Snapshot, key: str) -> dict[str, Any]:
        record = snap.records[key]
        return project_resource(record, snap.live.get(key) or _zero(snap.loaded_at.get(key, 0)))

    def project_detail(self, snap: Snapshot, key: str) -> dict[str, Any]:
        """GET /carbonProjects/{key}: the project with its live listings (cheapest first).

        Raises:
            Rejection: 404 ``project_not_found``.
        """
        found = snap.records.get(key) or snap.records.get(snap.lower_keys.get(key.lower(), ""))
        if found is None:
            raise not_found("project", key[:200])
        body = self.project(snap, found.key)
        body["listings"] = [self.listing(snap, cl) for cl in snap.listings.get(found.key, [])]
        return body

    def listing(self, snap: Snapshot, cl: ChainListing) -> dict[str, Any]:
        """A live seller listing (amounts in tonnes, prices in USDC per tonne, decimal strings)."""
        s = cl.state
        credit = snap.credits.get((cl.chain_id, s.credit_token, s.token_id))
        record = None if credit is None else snap.records.get(credit.project_key)
        return {
            "id": f"0x{s.listing_id:064x}",
            "assetPriceSourceId": str(SourceId(cl.chain_id, s.listing_id)),
            "chainId": cl.chain_id,
            "leftToSell": format_tonnes(s.left_to_sell),
            "totalAmountToSell": format_tonnes(s.total_amount),
            "singleUnitPrice": usdc(s.unit_price),
            "minFillAmount": format_tonnes(s.min_fill),
            "tokenAddress": s.credit_token,
            "active": s.active,
            "deleted": False,
            "createdAt": str(s.created_at),
            "updatedAt": str(s.updated_at),
            "expiration": str(s.expiration),
            "seller": {"id": s.seller},
            "creditId": "" if credit is None else f"{credit.project_key}-{credit.vintage}",
            "project": None
            if credit is None
            else {
                "key": credit.project_key,
                "vintage": str(credit.vintage),
                "registry": credit.registry,
                "name": record.name if record else "",
                "category": record.category if record else "",
                "country": record.country if record else "",
                "methodology": record.methodologies[0].id if record and record.methodologies else "",
            },
            "token": {
                "address": s.credit_token,
                "tokenId": str(s.token_id),
                "tokenStandard": "ERC1155",
                "decimals": 3,
            },
        }

    # ------------------------------------------------------------------ prices

    def prices(self, snap: Snapshot, q: PricesQuery) -> Page:
        """GET /prices: live seller listings only, cheapest first (spec: Rules 1, 3)."""
        items = []
        for cl in snap.all_listings:
            if q.chainId is not None and cl.chain_id != q.chainId:
                continue
            credit = snap.credits.get((cl.chain_id, cl.state.credit_token, cl.state.token_id))
            if credit is None:
                continue
            if q.projectKey is not None and credit.project_key.lower() != q.projectKey.lower():
                continue
            items.append(cl)
        page = items[q.offset : q.offset + q.limit]
        out = []
        for cl in page:
            s = cl.state
            out.append(
                {
                    "sourceId": str(SourceId(cl.chain_id, s.listing_id)),
                    "type": "listing",
                    "purchasePrice": usdc(s.unit_price),
                    "baseUnitPrice": usdc(s.unit_price),
                    "supply": format_tonnes(s.left_to_sell),
                    "liquidSupply": format_tonnes(s.left_to_sell),
                    "minFillAmount": format_tonnes(s.min_fill),
                    "listing": self.listing(snap, cl),
                }
            )
        return Page(out, len(items), q.offset, q.limit)

    # ------------------------------------------------------------------ retirements

    def retirement_view(self, r: IndexedRetirement) -> dict[str, Any]:
        """One retirement (amount in tonnes, timestamp unix seconds as a string)."""
        rid = str(RetirementId(r.chain_id, r.tx_hash, r.retirement_index))
        d = r.details
        retiring = d.get("retiringAddress") or r.payer
        if retiring == ZERO_ADDRESS:
            retiring = r.payer
        tx = "0x" + r.tx_hash.hex()
        base = f"{self.public_base_url}/retirements/{rid}"
        return {
            "id": rid,
            "chainId": r.chain_id,
            "chain": display_name(r.chain_id),
            "amount": format_tonnes(r.amount_units),
            "hash": tx,
            "index": r.retirement_index,
            "blockNumber": r.block_number,
            "timestamp": str(r.block_timestamp),
            "beneficiaryAddress": r.beneficiary,
            "beneficiaryName": d.get("beneficiaryString", ""),
            "beneficiaryLocation": d.get("beneficiaryLocation", ""),
            "retirementMessage": d.get("retirementMessage", ""),
            "retiringAddress": retiring,
            "retiringName": d.get("retiringEntityString", ""),
            "token": r.credit_token,
            "tokenId": str(r.token_id),
            "creditId": f"{r.project_id}-{r.vintage}",
            "project": {"key": r.project_id, "vintage": str(r.vintage), "registry": r.registry},
            "onChainExplorerUrl": explorer_tx_url(r.chain_id, tx),
            "viewRetirementUrl": f"{base}/certificate?format=html",
            "certificateUrl": f"{base}/certificate",
            "provenanceUrl": f"{base}/provenance",
        }

    async def retirement_page(self, q: RetirementsQuery) -> Page:
        """GET /retirements: every indexed chain (or ``chainId``), newest first, one page."""
        if q.chainId is not None and q.chainId not in self.chains:
            raise bad_request(
                "unsupported_chain", f"chain {q.chainId} is not indexed here", supported=sorted(self.chains)
            )
        rows, total = await self.retirements.search(
            q.chainId, q.beneficiaryAddress, q.retiringAddress, q.projectKey, q.offset, q.limit
        )
        return Page([self.retirement_view(r) for r in rows], total, q.offset, q.limit)

    async def retirement(self, rid: RetirementId) -> IndexedRetirement:
        """Raises Rejection 404 ``retirement_not_found`` (not indexed, or not yet)."""
        found = (
            await self.retirements.by_transaction(rid.chain_id, rid.tx_hash, rid.index)
            if rid.chain_id in self.chains
            else []
        )
        if not found:
            raise not_found("retirement", str(rid))
        return found[0]

    async def provenance(self, rid: RetirementId) -> list[dict[str, Any]]:
        """GET /retirements/{id}/provenance: origination, transfers and the retirement of the
        retired credit, oldest first, from indexed ERC-1155 transfer events.

        Raises:
            Rejection: 404 ``retirement_not_found``.
        """
        r = await self.retirement(rid)
        transfers = await self.store.transfers_of(r.chain_id, r.credit_token, r.token_id, r.block_number)
        burns = [t for t in transfers if t.tx_hash == r.tx_hash and t.receiver == ZERO_ADDRESS]
        burn = _burn_of(burns, r)
        if burn is None:
            return []
        records = []
        for step in provenance(transfers, burn):
            t = step.transfer
            records.append(
                {
                    "id": f"{r.chain_id}-0x{t.tx_hash.hex()}-{t.log_index}-{t.batch_index}",
                    "transactionType": step.kind,
                    "transactionHash": "0x" + t.tx_hash.hex(),
                    "registrySerialNumbers": [],
                    "token": {"address": r.credit_token, "tokenId": str(r.token_id)},
                    "creditId": f"{r.project_id}-{r.vintage}",
                    "sender": t.sender,
                    "receiver": t.receiver,
                    "originalAmount": format_tonnes(t.amount),
                    "remainingAmount": format_tonnes(step.remaining),
                    "createdAt": str(t.timestamp),
                    "updatedAt": str(t.timestamp),
                }
            )
        return records

    async def certificate(self, rid: RetirementId) -> CertificateView:
        """What a certificate shows (404 ``retirement_not_found``)."""
        r = await self.retirement(rid)
        view = self.retirement_view(r)
        snap = await self.snapshot()
        record = snap.records.get(r.project_id)
        return CertificateView(
            retirement_id=view["id"],
            chain_id=r.chain_id,
            chain_name=view["chain"],
            transaction_hash=view["hash"],
            retirement_index=r.retirement_index,
            beneficiary_name=view["beneficiaryName"],
            beneficiary_address=r.beneficiary,
            retiring_address=view["retiringAddress"],
            retiring_name=view["retiringName"],
            message=view["retirementMessage"],
            amount_tonnes=view["amount"],
            project_key=r.project_id,
            project_name="" if record is None else record.name,
            vintage=str(r.vintage),
            registry=r.registry,
            timestamp=r.block_timestamp,
            verify_url=f"{self.public_base_url}/retirements/{view['id']}",
        )

    # ------------------------------------------------------------------ API keys

    async def authenticate(self, authorization: str | None) -> int:
        """The API key id of a ``Bearer`` token, its hash compared in constant time.

        Raises:
            Rejection: 401 ``unauthorized`` (missing, malformed, unknown or revoked).
        """
        refused = Rejection(
            "unauthorized",
            "a valid API key is required: Authorization: Bearer <key> (relayer apikey create)",
        )
        if authorization is None or not authorization.startswith("Bearer ") or len(authorization) > 200:
            raise refused
        token = authorization.removeprefix("Bearer ").strip()
        parts = token.split("_")
        if len(parts) < 3 or not token.startswith(API_KEY_PREFIX) or len(parts[1]) != 12:
            raise refused
        digest = hashlib.sha256(token.encode()).digest()
        matched = None
        for key_id, key_hash in await self.orders.keys_with_prefix(parts[1]):
            if hmac.compare_digest(key_hash, digest):
                matched = key_id
        if matched is None:
            raise refused
        return matched

    # ------------------------------------------------------------------ quotes and orders

    async def quote(self, key_id: int, req: QuoteRequest, now: int) -> dict[str, Any]:
        """POST /quotes (see :meth:`OrderDesk.quote`)."""
        return await self.desk.quote(key_id, req, now)

    async def place_order(self, key_id: int, req: OrderRequest, now: int) -> dict[str, Any]:
        """POST /orders (see :meth:`OrderDesk.place`)."""
        return await self.desk.place(key_id, req, now)

    async def order(self, key_id: int, order_id: str) -> dict[str, Any]:
        """GET /orders/{id} (see :meth:`OrderDesk.order`)."""
        return await self.desk.order(key_id, order_id)


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


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _burn_of(burns: list[Transfer], r: IndexedRetirement) -> Transfer | None:
    """The burn of this retirement among its transaction's burns of the credit: the one at its
    index's rank when several retire the same credit in one transaction."""
    matching = [t for t in burns if t.amount == r.amount_units] or burns
    if not matching:
        return None
    return matching[min(r.retirement_index, len(matching) - 1)]


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("catalogue refresh failed", extra={"error": type(task.exception()).__name__})


def page_json(page: Page) -> bytes:
    return json.dumps(page.items, separators=(",", ":")).encode()
