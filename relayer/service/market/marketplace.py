"""The marketplace catalogue API's services (spec: marketplace-api.md, release v18), one a
job: the catalogue snapshot (:mod:`.snapshot`), project and price views (:mod:`.projects`),
retirement views (:mod:`.retirements`), API keys (:mod:`.keys`), and quotes and orders
(:mod:`.orders`). :class:`Marketplace` only wires them over the shared store and relay."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from relayer.chain.signer import TreasurySigner
from relayer.domain import views
from relayer.domain.marketplace import OrderRequest, QuoteRequest, parse_source_id
from relayer.service.market.keys import ApiKeys
from relayer.service.market.orders import ORDER_GRACE_S, OrderDesk
from relayer.service.market.retirements import RetirementViews
from relayer.service.market.snapshot import CatalogueSnapshots, IndexedChain
from relayer.service.prepare import Prepare
from relayer.service.project_records import ProjectRecords
from relayer.service.relay import Relay
from relayer.service.supply import Supply
from relayer.store.catalogue import CatalogueStore
from relayer.store.identity import ChainIdentity
from relayer.store.orders import Orders
from relayer.store.retirements import RetirementStore


class Marketplace:
    """The catalogue API's services.

    Attributes:
        snapshots: the catalogue snapshot (projects, live figures, listings).
        retirements: retirements, provenance and certificates.
        keys: bearer API keys.
        desk: quotes, orders and the order keeper's step on this chain.
        desks: the order desk of every chain this daemon retires on, by chain id (this
            chain's first; the others' added by :meth:`order_on`).
        public_base_url: where callers reach this daemon (no trailing slash).
        issuer: who issues the certificates (``Settings.issuer``).
    """

    def __init__(
        self,
        store: CatalogueStore,
        retirements: RetirementStore,
        orders: Orders,
        supply: Supply,
        prepare: Prepare,
        relay: Relay,
        chains: Sequence[IndexedChain],
        public_base_url: str,
        quote_lifetime_s: int,
        treasury: TreasurySigner | None,
        clock: Callable[[], float] = time.time,
        project_records: ProjectRecords | None = None,
        order_grace_s: int = ORDER_GRACE_S,
        issuer: str = "relayer",
    ) -> None:
        self.public_base_url = public_base_url
        self.snapshots = CatalogueSnapshots(store, project_records or ProjectRecords(store), chains, clock)
        self.retirements = RetirementViews(
            retirements, store, self.snapshots, public_base_url, ChainIdentity(store.db), issuer
        )
        self.keys = ApiKeys(orders)
        self.desk = OrderDesk(
            store,
            orders,
            retirements,
            supply,
            prepare,
            relay,
            treasury,
            quote_lifetime_s,
            public_base_url,
            clock,
            order_grace_s,
        )
        self.desks = {self.desk.chain_id: self.desk}

    def order_on(self, desks: Sequence[OrderDesk]) -> None:
        """Take orders on the other relayed chains too, each with that chain's desk."""
        for desk in desks:
            self.desks[desk.chain_id] = desk

    def desk_for(self, chain_id: int) -> OrderDesk:
        """The desk of ``chain_id``; this chain's for a chain no order retires on (which
        refuses it ``unsupported_chain``, naming the chains served)."""
        return self.desks.get(chain_id, self.desk)

    async def quote(self, key_id: int, req: QuoteRequest, now: int) -> views.Quote:
        """POST /quotes on the listing's chain (see :meth:`OrderDesk.quote`)."""
        source = parse_source_id(req.asset_price_source_id)
        return await self.desk_for(source.chain_id).quote(key_id, req, now)

    async def place(self, key_id: int, req: OrderRequest, now: int) -> views.Order:
        """POST /orders on the quote's chain (see :meth:`OrderDesk.place`; a quote that is not
        this key's is refused by this chain's desk, ``quote_not_found``)."""
        quote = await self.desk.orders.quote(uuid.UUID(req.quote_uuid), key_id)
        return await self.desk_for(self.desk.chain_id if quote is None else quote.chain_id).place(
            key_id, req, now
        )
