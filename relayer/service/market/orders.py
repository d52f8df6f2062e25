"""Marketplace quotes and orders (spec: marketplace-api.md, POST /quotes, POST /orders,
GET /orders/{id}): a single-use quote priced from a seller listing, and an order that retires
it from the operator's treasury through the relay's typed entry
(:meth:`~relayer.service.relay.Relay.accept_authorization`): the same checks, salt
reservation, solvency rule, job, broadcaster and follower as any gasless retirement.

An order never strands. The quote is consumed and the order recorded in one transaction only
after the listing (read once from the node), the quoted price and the treasury's balance were
checked. Then one attempt hands it to the relay:

- it gets a relay job: its status follows the job's state to COMPLETED or FAILED;
- the relay refuses it (a refusal, a revert): the order is FAILED with the reason and what
  to do next (the quote is spent: ask for a new one);
- an upstream fails (node, database) or the process dies: the order stays SUBMITTED and the
  order keeper (:meth:`OrderDesk.resume`) attempts it again until it has a job, or fails it
  after :data:`ORDER_RETRY_WINDOW_S`.

Attempts are idempotent: an order's salt and request key derive from its id, so every attempt
(the request's own, the keeper's, another process's) binds the same salt, and the relay answers
a second attempt with the first attempt's job. Amounts: credit units (1000 a tonne) and USDC
atomic units inside, decimal strings outside; times in unix seconds.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, Final

from relayer.chain.signer import TreasurySigner
from relayer.chain.types import CreditInfo
from relayer.domain import fees, views
from relayer.domain.amounts import format_tonnes
from relayer.domain.errors import Rejection, RelayerError, Unavailable
from relayer.domain.fill import FillRefusal, Unfillable, check_fill
from relayer.domain.marketplace import (
    OrderRequest,
    QuoteRequest,
    RetirementId,
    SourceId,
    bad_request,
    not_found,
    parse_source_id,
    quantity_units,
    usdc,
    validated,
)
from relayer.domain.retirement import retirement_links
from relayer.domain.schemas import Details
from relayer.domain.states import JobState
from relayer.service.prepare import Prepare
from relayer.service.relay import Relay
from relayer.service.supply import Supply
from relayer.service.terms import Resolved, attribute
from relayer.service.treasury import TreasuryRetirements, derived_key
from relayer.store.catalogue import CatalogueStore, ChainListing
from relayer.store.orders import Order, Orders, Quote, QuoteSpent
from relayer.store.retirements import RetirementStore

log = logging.getLogger(__name__)

ORDER_RETRY_WINDOW_S: Final = 900
"""An order whose hand-over to the relay keeps failing on an outage is FAILED this many
seconds after it was recorded (the keeper attempts it until then)."""
ORDER_GRACE_S: Final = 10
"""The default of ``RELAYER_ORDER_GRACE_S``: the keeper leaves an order without a job alone
for this many seconds after it was recorded (its own request is still attempting it)."""
RESUME_BATCH: Final = 20
"""Orders the keeper attempts per step, oldest first."""

ORDER_STATUS: Final[dict[str, views.OrderStatus]] = {
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
"""An order's status (the public API's SUBMITTED … COMPLETED, FAILED) from its relay job's state;
an order without a job is SUBMITTED (pending) unless it failed."""


def order_salt(order_id: uuid.UUID) -> bytes:
    """The 32-byte salt every attempt of order ``order_id`` binds into its authorization nonce
    (one salt, so at most one live relay job per order)."""
    return derived_key("marketplace-order/salt", order_id)


def order_request_key(order_id: uuid.UUID) -> bytes:
    """The 32-byte key naming order ``order_id``'s request to the relay: a repeated attempt is
    answered with the first attempt's job."""
    return derived_key("marketplace-order/request", order_id)


def marketplace_fill_refusal(refusal: FillRefusal, listing_id: int, chain_id: int) -> Rejection:
    """The marketplace's refusal of a fill the one fill rule refused."""
    source = str(SourceId(chain_id, listing_id))
    left, reason = format_tonnes(refusal.left_to_sell), refusal.reason
    if reason is Unfillable.CANCELLED:
        return Rejection("listing_cancelled", "the listing was cancelled", listing=source)
    if reason is Unfillable.EXPIRED:
        return Rejection("listing_expired", "the listing has expired", listing=source)
    if reason is Unfillable.SOLD_OUT:
        return Rejection("listing_sold_out", "the listing is sold out", listing=source)
    if reason is Unfillable.INSUFFICIENT_SUPPLY:
        return Rejection("insufficient_listing_supply", f"the listing has {left} t left", leftToSell=left)
    if reason is Unfillable.BELOW_MIN_FILL:
        minimum = format_tonnes(refusal.min_fill)
        return bad_request("below_min_fill", f"the listing's minimum fill is {minimum} t", minFill=minimum)
    return bad_request("amount_not_whole_tonnes", "this registry's credits retire in whole tonnes only")


def next_step(q: Quote) -> str:
    """What to do after an order failed: its quote is spent, so a new quote is the way to try
    again (the body of that ``POST /quotes``)."""
    return (
        "this order's quote is spent; ask for a new one: POST /quotes "
        f'{{"asset_price_source_id": "{SourceId(q.chain_id, q.listing_id)}", '
        f'"quantity_tonnes": "{format_tonnes(q.quantity_units)}"}}'
    )


def failure_record(error: RelayerError, q: Quote) -> dict[str, Any]:
    """How a FAILED order shows why: the reason's ``code`` and ``message``, and ``next``
    (:func:`next_step`)."""
    return {"code": error.code, "message": error.message, "next": next_step(q)}


class OrderDesk:
    """POST /quotes, POST /orders, GET /orders/{id}, and the order keeper's step."""

    def __init__(
        self,
        store: CatalogueStore,
        orders: Orders,
        retirements: RetirementStore,
        supply: Supply,
        prepare: Prepare,
        relay: Relay,
        treasury: TreasurySigner | None,
        quote_lifetime_s: int,
        public_base_url: str,
        clock: Callable[[], float],
        grace_s: int = ORDER_GRACE_S,
    ) -> None:
        self.store = store
        self.orders = orders
        self.retirements = retirements
        self.supply = supply
        self.prepare = prepare
        self.relay = relay
        self.signed = TreasuryRetirements(relay, prepare)
        self.treasury = treasury
        self.quote_lifetime_s = quote_lifetime_s
        self.public_base_url = public_base_url
        self.clock = clock
        self.grace_s = grace_s
        self.chain_id = supply.chain_id

    # ------------------------------------------------------------------ quotes

    async def quote(self, key_id: int, req: QuoteRequest, now: int) -> views.Quote:
        """POST /quotes: a single-use quote priced from the indexed listing now, valid for
        ``quote_lifetime_s``.

        Raises:
            Rejection: 400 ``not_a_listing``, ``invalid_quantity``,
                ``unsupported_chain``, ``below_min_fill``, ``amount_not_whole_tonnes``; 404
                ``listing_not_found``; 409 ``listing_cancelled``, ``listing_expired``,
                ``listing_sold_out``, ``insufficient_listing_supply``.
            Unavailable: the node or the database failed.
        """
        source = parse_source_id(req.asset_price_source_id)
        units = quantity_units(req.quantity_tonnes)
        self._check_chain(source)
        cl = await self.store.listing(source.chain_id, source.listing_id)
        if cl is None:
            raise not_found("listing", str(source))
        fee_quote = await self._fillable(cl, units, now)
        cost = fees.listing_cost_usdc(cl.state.unit_price, units)
        q = Quote(
            uuid.uuid4(),
            key_id,
            cl.chain_id,
            cl.marketplace,
            cl.state.listing_id,
            units,
            cl.state.unit_price,
            cost,
            now,
            now + self.quote_lifetime_s,
            None,
        )
        await self.orders.add_quote(q)
        return quote_body(q, fee_quote)

    def _check_chain(self, source: SourceId) -> None:
        if source.chain_id not in self.supply.served:
            raise bad_request(
                "unsupported_chain",
                f"orders retire on chain {' and '.join(map(str, self.supply.served))} only, "
                f"not on chain {source.chain_id}",
                supported=self.supply.served,
            )

    async def _fillable(self, cl: ChainListing, units: int, now: int) -> fees.Quote:
        """The indexed listing checked by the one fill rule for ``units``; its fee quote."""
        s = cl.state
        credit = await self.supply.chain.credit(s.token_id) if s.active else None
        refusal = check_fill(s, units, now, whole_tonnes_only=credit is not None and credit.whole_tonnes_only)
        if refusal is not None:
            raise marketplace_fill_refusal(refusal, s.listing_id, cl.chain_id)
        return fees.quote_listing(s.unit_price, units, await self.supply.chain.fee_schedule())

    # ------------------------------------------------------------------ orders

    async def place(self, key_id: int, req: OrderRequest, now: int) -> views.Order:
        """POST /orders: check the quote, the listing (one node read) and the treasury, consume
        the quote and record the order in one transaction, then attempt it (see the module).
        An order refused after its quote was consumed answers FAILED with its reason; one
        whose upstream failed answers SUBMITTED and is attempted again by the keeper.

        Raises:
            Rejection: 400 ``not_a_listing``, ``quote_mismatch``,
                ``consumption_metadata_required``; 404 ``quote_not_found``; 409
                ``quote_consumed``, ``quote_expired``, ``quote_outdated`` and the listing
                refusals of :meth:`quote`; 503 ``orders_unavailable`` (no treasury
                configured, or its USDC balance cannot pay for the order now).
            Unavailable: the node or the database failed before the quote was consumed
                (nothing was recorded), or the database failed afterwards (``orderId``
                names the order, which the keeper completes).
        """
        treasury = self._treasury()
        quote_uuid = uuid.UUID(req.quote_uuid)
        q = await self.orders.quote(quote_uuid, key_id)
        if q is None:
            raise not_found("quote", req.quote_uuid)
        _check_quote(q, req, now)
        beneficiary = req.beneficiary_address or treasury.address
        consumption = None if req.consumption_metadata is None else req.consumption_metadata.model_dump()
        resolved = await self._resolve(
            q, req.beneficiary_name, req.retirement_message, beneficiary, consumption, now
        )
        await self._treasury_covers(treasury, resolved)
        order_id = uuid.uuid4()
        try:
            await self.orders.place(
                order_id,
                quote_uuid,
                key_id,
                req.beneficiary_name,
                beneficiary,
                req.retirement_message,
                consumption,
                now,
            )
        except QuoteSpent:
            raise Rejection("quote_consumed", "this quote was already used by an order") from None
        try:
            await self._attempt(order_id, q, now, now, resolved)
            return await self.order(key_id, str(order_id))
        except Unavailable as outage:
            outage.context["orderId"] = str(order_id)
            raise

    def _treasury(self) -> TreasurySigner:
        if self.treasury is None:
            raise Rejection("orders_unavailable", "this operator takes no orders (no treasury key)")
        return self.treasury

    async def _resolve(
        self,
        q: Quote,
        name: str,
        message: str,
        beneficiary: str,
        consumption: dict[str, Any] | None,
        now: int,
    ) -> Resolved:
        """The quoted fill resolved, priced and attributed from the listing read once from the
        node now (the treasury pays; the beneficiary is attributed).

        Raises:
            Rejection: the listing refusals, 409 ``quote_outdated`` (the price moved),
                400 ``consumption_metadata_required``.
            Rejection: attribution_required, schema_validation.
            Unavailable: the node failed.
        """
        treasury = self._treasury()

        def refuse(refusal: FillRefusal, listing_id: int, credit: CreditInfo | None) -> Exception:
            return marketplace_fill_refusal(refusal, listing_id, q.chain_id)

        route = await self.supply.listing_route(
            q.listing_id, q.quantity_units, self.supply.token("USDC"), now, refuse
        )
        if route.listing is None or route.listing.unit_price != q.unit_price:
            price = q.unit_price if route.listing is None else route.listing.unit_price
            raise Rejection(
                "quote_outdated",
                "the listing's price changed since the quote; ask for a new one",
                unit_price_usdc=usdc(price),
            )
        if route.credit.requires_consumption_metadata and consumption is None:
            raise bad_request(
                "consumption_metadata_required",
                f"{route.credit.registry} retirements need consumption_metadata "
                "(consumptionCountryCode, consumptionPeriodStart, consumptionPeriodEnd)",
            )
        # the edge's OrderRequest takes what Details takes; a fault here is still a 400
        details = validated(
            Details,
            {
                "beneficiaryAddress": beneficiary,
                "beneficiaryString": name,
                "retirementMessage": message,
                **(consumption or {}),
            },
        )
        return attribute(route, treasury.address, details)

    async def _treasury_covers(self, treasury: TreasurySigner, resolved: Resolved) -> None:
        """Refuse, before anything is consumed, an order the treasury's USDC cannot pay for.

        Raises:
            Rejection: 503 ``orders_unavailable`` (the treasury is short).
            Unavailable: the node failed.
        """
        token = resolved.route.token.address
        held = await self.supply.chain.balance(token, treasury.address)
        if held.amount < resolved.route.quote.total:
            log.warning("the treasury cannot pay for an order: refused before its quote was consumed")
            raise Rejection(
                "orders_unavailable",
                "the operator cannot take this order now; nothing was charged and the quote is still "
                "valid until it expires. Retry later.",
            )

    async def _attempt(
        self, order_id: uuid.UUID, q: Quote, recorded_at: int, now: int, resolved: Resolved
    ) -> None:
        """Hand a recorded order to the relay once: link its job, fail it on a refusal, or
        leave it pending for the keeper on an outage (failing it past the retry window).

        Raises:
            Unavailable: only when the database failed while recording the outcome.
        """
        treasury = self._treasury()
        failure: RelayerError
        try:
            salt, key = order_salt(order_id), order_request_key(order_id)
            job = await self.signed.accept(treasury, resolved, salt, key, now, refuse=self._refuse)
        except Unavailable as outage:
            if int(self.clock()) - recorded_at < ORDER_RETRY_WINDOW_S:
                log.warning(
                    "order waits for its upstream; the order keeper attempts it again",
                    extra={"order": str(order_id), "upstream": outage.context.get("upstream")},
                )
                return
            failure = outage
        except RelayerError as refusal:
            failure = refusal
        else:
            await self.orders.set_job(order_id, job.id, int(self.clock()))
            return
        if await self._link_existing_job(order_id):  # a concurrent attempt reserved its salt first
            return
        log.warning("order failed", extra={"order": str(order_id), "code": failure.code})
        await self.orders.set_error(order_id, failure_record(failure, q), int(self.clock()))

    def _refuse(self, refusal: FillRefusal, listing_id: int, credit: CreditInfo | None) -> Exception:
        """The marketplace's refusal of a fill the relay refused (the supply in flight)."""
        return marketplace_fill_refusal(refusal, listing_id, self.chain_id)

    async def resume(self) -> int:
        """The order keeper's step: attempt again each order recorded more than ``grace_s``
        (:data:`ORDER_GRACE_S` by default) ago that has neither a job nor an error (at most
        :data:`RESUME_BATCH`, oldest first); how many were attempted.

        Raises:
            Unavailable: the database failed.
        """
        now = int(self.clock())
        pending = await self.orders.pending(self.chain_id, now - self.grace_s, RESUME_BATCH)
        for o in pending:
            if await self._link_existing_job(o.id):
                continue
            try:
                consumption = o.consumption_metadata
                resolved = await self._resolve(
                    o.quote, o.beneficiary_name, o.retirement_message, o.beneficiary_address, consumption, now
                )
            except Unavailable as outage:
                if now - o.created_at < ORDER_RETRY_WINDOW_S:
                    continue
                failure: RelayerError = outage
            except RelayerError as refusal:
                failure = refusal
            else:
                await self._attempt(o.id, o.quote, o.created_at, now, resolved)
                continue
            log.warning("order failed", extra={"order": str(o.id), "code": failure.code})
            await self.orders.set_error(o.id, failure_record(failure, o.quote), int(self.clock()))
        return len(pending)

    async def _link_existing_job(self, order_id: uuid.UUID) -> bool:
        """Link the relay job another attempt made (a process that died before recording it,
        or a concurrent attempt), found by the order's salt; whether there was one. A rejected
        job is not linked: the next attempt re-opens it with the same salt."""
        job = await self.relay.jobs.find_by_salt(self.chain_id, order_salt(order_id))
        if job is None or job.state is JobState.REJECTED or job.request_hash != order_request_key(order_id):
            return False
        log.info(
            "order linked to the relay job of another attempt", extra={"order": str(order_id), "job": job.id}
        )
        await self.orders.set_job(order_id, job.id, int(self.clock()))
        return True

    async def order(self, key_id: int, order_id: str) -> views.Order:
        """GET /orders/{id}: the order and its status (404 ``order_not_found``)."""
        try:
            parsed = uuid.UUID(order_id)
        except ValueError:
            raise not_found("order", order_id[:100]) from None
        o = await self.orders.order(parsed, key_id)
        if o is None:
            raise not_found("order", order_id[:100])
        return await self._order_body(o)

    async def _order_body(self, o: Order) -> views.Order:
        status: views.OrderStatus = (
            "FAILED" if o.error is not None else ORDER_STATUS.get(o.job_state or "", "SUBMITTED")
        )
        error = o.error
        if error is None and status == "FAILED" and o.job_error is not None:
            error = {k: o.job_error[k] for k in ("code", "message") if k in o.job_error}
            error["next"] = next_step(o.quote)
        tx = None if o.tx_hash is None else "0x" + o.tx_hash.hex()
        index = None
        view = None
        if status == "COMPLETED" and o.tx_hash is not None:
            found = await self.retirements.by_transaction(o.quote.chain_id, o.tx_hash)
            if found:
                index = found[0].retirement_index
                rid = str(RetirementId(found[0].chain_id, o.tx_hash, index))
                view = retirement_links(self.public_base_url, rid)["viewRetirementUrl"]
        return {
            "id": str(o.id),
            "status": status,
            "transaction_hash": tx if status not in ("SUBMITTED", "INITIATED") else None,
            "retirement_index": index,
            "view_retirement_url": view,
            "beneficiary_name": o.beneficiary_name,
            "beneficiary_address": o.beneficiary_address,
            "retirement_message": o.retirement_message,
            "created_at": str(o.created_at),
            "updated_at": str(o.updated_at),
            "error": error,
            "quote": quote_body(o.quote),
        }


def _check_quote(q: Quote, req: OrderRequest, now: int) -> None:
    """The order's quote is its listing's, unspent and unexpired.

    Raises:
        Rejection: 400 ``quote_mismatch``, ``not_a_listing``; 409 ``quote_consumed``,
            ``quote_expired``.
    """
    if req.asset_price_source_id is not None:
        given = parse_source_id(req.asset_price_source_id)
        if given != SourceId(q.chain_id, q.listing_id):
            raise bad_request("quote_mismatch", "asset_price_source_id is not the quote's listing")
    if q.consumed_at is not None:
        raise Rejection("quote_consumed", "this quote was already used by an order")
    if q.expires_at <= now:
        raise Rejection("quote_expired", "this quote has expired; ask for a new one")


def quote_body(q: Quote, fee_quote: fees.Quote | None = None) -> views.Quote:
    """A quote as POST /quotes and the order's ``quote`` show it (USDC decimal strings)."""
    body: views.Quote = {
        "uuid": str(q.uuid),
        "created_at": str(q.created_at),
        "expires_at": str(q.expires_at),
        "asset_price_source_id": str(SourceId(q.chain_id, q.listing_id)),
        "quantity_tonnes": format_tonnes(q.quantity_units),
        "unit_price_usdc": usdc(q.unit_price),
        "cost_usdc": usdc(q.cost_usdc),
        "consumed": q.consumed_at is not None,
    }
    if fee_quote is not None:
        body["fee_usdc"] = usdc(fee_quote.fee)
        body["total_usdc"] = usdc(fee_quote.total)
    return body
