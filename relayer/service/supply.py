"""Supply resolution and live quotes (spec: quote, prepare-auth; Limits 1-5).

Reads come from the chain layer; every rule and every rounding is the domain's. Raises
:class:`~relayer.domain.errors.Rejection` with the spec's resolution and amount codes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from relayer.chain.reads import ChainReads
from relayer.chain.types import ClassInfo, CreditInfo
from relayer.config import Settings
from relayer.domain import fees, views
from relayer.domain.amounts import (
    KVCM_DECIMALS,
    UNITS_PER_TONNE,
    USDC_DECIMALS,
    format_tonnes,
    format_units,
    parse_tonnes,
)
from relayer.domain.chains import relay_supported
from relayer.domain.errors import Rejection
from relayer.domain.fill import FillRefusal, Unfillable, check_fill
from relayer.domain.marketplace import ListingInfo
from relayer.domain.retirement import SOURCE_CARBON_CLASS, SOURCE_LISTING
from relayer.domain.schemas import ActionRequest, require
from relayer.domain.verify import Scheme
from relayer.service.project_records import ProjectRecords

PROJECTS_MAX_AGE_S: Final = 1.0
"""How long (seconds) the project filters use the catalogue version last checked before asking
the database again: ``relayer catalogue load`` shows in discover within this."""

FillRefuser = Callable[[FillRefusal, int, CreditInfo | None], Exception]
"""What a surface raises for a refused fill of a listing (its refusal, listing id, credit)."""


@dataclass(frozen=True, slots=True)
class Token:
    """An accepted input token: ``key`` "usdc" (EIP-3009) or "kvcm" (EIP-2612), its
    checksummed address, decimals and contract name in contracts_abi/."""

    key: str
    symbol: str
    address: str
    decimals: int
    contract: str

    @property
    def scheme(self) -> Scheme:
        """The gasless authorization scheme this token is paid with."""
        return "eip3009" if self.key == "usdc" else "eip2612"


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved, priced retirement route. Amounts: ``units`` in credit units; ``quote``
    in input-token atomic units."""

    source: int
    source_id: int
    carbon_class: ClassInfo | None
    listing: ListingInfo | None
    credit: CreditInfo
    credit_token: str
    token: Token
    units: int
    quote: fees.Quote
    suggested_max_input: int


class Supply:
    """Resolution and quoting against live chain state (discover lists it:
    :class:`relayer.service.discover.Discover`); the project filters (country, category,
    methodology) read the catalogue's project records."""

    def __init__(self, reads: ChainReads, settings: Settings, projects: ProjectRecords) -> None:
        self.chain = reads
        self.chain_id = reads.node.chain_id
        self.contracts = reads.contracts
        self.settings = settings
        self.served = sorted(settings.served_chain_ids())
        """Every chain this daemon relays on (``RELAYER_CHAIN_ID`` and ``RELAYER_RELAY_CHAINS``)."""
        self.projects = projects
        self.tokens = {
            "usdc": Token("usdc", "USDC", reads.contracts.usdc, USDC_DECIMALS, "UsdcEip3009"),
            "kvcm": Token("kvcm", "kVCM", reads.contracts.kvcm, KVCM_DECIMALS, "KlimaVcm"),
        }

    # ------------------------------------------------------------------ parameters

    def serves(self, chain_id: int | None) -> bool:
        """Whether a request's ``chainId`` is absent or this chain (a request for another
        chain this daemon relays on is routed to that chain's services before it gets here)."""
        return chain_id is None or (relay_supported(chain_id) and chain_id == self.chain_id)

    def check_chain(self, chain_id: int | None) -> None:
        """Raises ``unsupported_chain_id`` (naming the chains served) unless ``chain_id`` is
        None or this chain."""
        if not self.serves(chain_id):
            raise Rejection(
                "unsupported_chain_id",
                f"chainId {chain_id} is not served here; this endpoint serves {self._served_text()}",
                supported=self.served,
            )

    def check_chain_field(self, chain_id: int | None) -> None:
        """The ``chainId`` of an action whose codes do not include ``unsupported_chain_id``
        (discover, certificate; spec: Errors, codes per action): another chain is a request
        that failed validation.

        Raises:
            Rejection: ``schema_validation`` (``issues`` at ``chainId``; ``supported``).
        """
        if not self.serves(chain_id):
            raise Rejection(
                "schema_validation",
                f"chainId {chain_id} is not served here",
                issues=[
                    {
                        "path": ["chainId"],
                        "keys": [],
                        "message": f"this endpoint serves {self._served_text()}",
                    }
                ],
                supported=self.served,
            )

    def _served_text(self) -> str:
        return " and ".join(str(c) for c in self.served)

    def token(self, text: str | None) -> Token:
        """Resolve ``inputToken`` (symbol or address; default USDC).

        Raises:
            Rejection: ``unsupported_input_token``.
        """
        if text is None:
            return self.tokens["usdc"]
        lowered = text.lower()
        for token in self.tokens.values():
            if lowered in (token.symbol.lower(), token.address.lower()):
                return token
        raise Rejection(
            "unsupported_input_token", supported=[t.symbol for t in self.tokens.values()], inputToken=text
        )

    async def project_records(self, req: ActionRequest) -> None:
        """Bring the project records up to date (at most :data:`PROJECTS_MAX_AGE_S` old) when
        ``req`` filters by country, category or methodology; no I/O otherwise.

        Raises:
            StoreUnavailable: the catalogue database failed.
        """
        if req.country is not None or req.category is not None or req.methodology is not None:
            await self.projects.current(PROJECTS_MAX_AGE_S)

    def credit_matches(self, credit: CreditInfo, req: ActionRequest) -> bool:
        """Whether a credit passes the request's credit filters (token id, vintage, project,
        credit id, and its project's country, category and methodology code, case-insensitive;
        the project is the catalogue record keyed by the credit's project id, as of the last
        :meth:`project_records`)."""
        record = self.projects.latest.get(credit.project_id)
        for wanted, have in (
            (req.country, record.country if record else None),
            (req.category, record.category if record else None),
        ):
            if wanted is not None and (have is None or have.lower() != wanted.lower()):
                return False
        if req.methodology is not None and (
            record is None
            or req.methodology.lower() not in (m.id.lower() for m in record.methodologies if m.id)
        ):
            return False
        if req.tokenId is not None and credit.token_id != req.tokenId:
            return False
        if req.vintage is not None and credit.vintage != req.vintage:
            return False
        if req.project is not None and credit.project_id.lower() != req.project.lower():
            return False
        if req.credit is not None:
            want = req.credit.lower()
            return want in (credit.project_id.lower(), f"{credit.project_id}-{credit.vintage}".lower())
        return True

    # ------------------------------------------------------------------ resolution

    async def resolve(self, req: ActionRequest, now: int) -> Route:
        """Resolve and price the retirement a request describes (spec: quote): by
        ``carbonClass``, by ``listingId``, or by ``credit`` alone (through the one carbon
        class that holds it).

        Raises:
            Rejection: schema_validation, unsupported_chain_id, unsupported_input_token,
                no_candidates, credit_not_found, credit_ambiguous, vintage_not_found,
                listing_not_found, listing_expired, marketplace_requires_usdc,
                insufficient_liquidity, amount_not_whole_tonnes, amount_below_increment,
                below_min_fill, insufficient_listing_supply.
            StoreUnavailable: a country, category or methodology filter, and the catalogue
                database failed.
        """
        self.check_chain(req.chainId)
        await self.project_records(req)
        by_credit = req.carbonClass is None and req.listingId is None and req.credit is not None
        if not by_credit and (req.carbonClass is None) == (req.listingId is None):
            raise Rejection(
                "schema_validation",
                "give exactly one of carbonClass or listingId (or a credit alone)",
                issues=[
                    {
                        "path": ["carbonClass"],
                        "keys": ["carbonClass", "listingId"],
                        "message": "exactly one of carbonClass or listingId",
                    }
                ],
            )
        require(req, "amount")
        assert req.amount is not None
        units = parse_tonnes(req.amount)
        token = self.token(req.inputToken)
        if req.creditToken is not None and req.creditToken != self.contracts.carbon_credits:
            raise Rejection("credit_not_found", f"unknown credit token {req.creditToken}")
        if req.listingId is not None:
            return await self.listing_route(req.listingId, units, token, now)
        if req.carbonClass is None:
            return await self._price_class(req, await self._class_of_credit(req, now), units, token)
        return await self._resolve_class(req, req.carbonClass, units, token)

    async def listing_route(
        self, listing_id: int, units: int, token: Token, now: int, refuse: FillRefuser | None = None
    ) -> Route:
        """Price a fill of ``units`` credit units of listing ``listing_id`` read from the node
        now, checked by the one fill rule (:func:`~relayer.domain.fill.check_fill`); a refused
        fill raises what ``refuse`` makes of it (default :func:`x402_fill_refusal`).

        Raises:
            Rejection: marketplace_requires_usdc, listing_not_found (unknown, and by default
                cancelled), and by default listing_expired, insufficient_listing_supply (also
                sold out), below_min_fill, amount_not_whole_tonnes.
            Unavailable: the chain node failed.
        """
        if token.key != "usdc":
            raise Rejection("marketplace_requires_usdc", supported=["USDC"])
        listing = await self.chain.listing(listing_id)
        if listing is None:
            raise Rejection("listing_not_found", listingId=str(listing_id))
        credit = await self.chain.credit(listing.token_id) if listing.active else None
        refusal = check_fill(
            listing, units, now, whole_tonnes_only=credit is not None and credit.whole_tonnes_only
        )
        if refusal is not None:
            raise (refuse or x402_fill_refusal)(refusal, listing_id, credit)
        assert credit is not None
        quote = fees.quote_listing(listing.unit_price, units, await self.chain.fee_schedule())
        return Route(
            SOURCE_LISTING,
            listing_id,
            None,
            listing,
            credit,
            listing.credit_token,
            token,
            units,
            quote,
            quote.total,
        )

    async def _class_of_credit(self, req: ActionRequest, now: int) -> ClassInfo:
        """The carbon class through which a request naming only a ``credit`` (a project id,
        or ``<project>-<vintage>``; optionally with ``tokenId`` and ``vintage``) retires:
        the one class holding it with liquidity (or, when none has any, the one registering
        it, which then answers no_candidates).

        Raises:
            Rejection: credit_not_found (no class registers the credit; ``listingId`` names
                a live listing of it when there is one), credit_ambiguous (several classes
                hold it: ``carbonClasses`` and ``candidates``, each a ready
                ``{carbonClass, tokenId, credit, vintage, liquidityFormatted}``),
                vintage_not_found (``availableVintages``).
        """
        classes = await self.chain.classes()
        token_ids = sorted({t for c in classes for t, _ in c.credits})
        credits = dict(zip(token_ids, await self.chain.credits(token_ids), strict=True))
        loose = req.model_copy(update={"vintage": None})
        holding = [
            (c, [(credits[t], a) for t, a in c.credits if self.credit_matches(credits[t], loose)])
            for c in classes
        ]
        holding = [(c, pairs) for c, pairs in holding if pairs]
        if not holding:
            raise await self._credit_not_found(loose, now)
        if req.vintage is not None:
            vintages = sorted({str(cr.vintage) for _, pairs in holding for cr, _ in pairs})
            holding = [(c, [p for p in pairs if p[0].vintage == req.vintage]) for c, pairs in holding]
            holding = [(c, pairs) for c, pairs in holding if pairs]
            if not holding:
                raise Rejection("vintage_not_found", availableVintages=vintages)
        stocked = [(c, [p for p in pairs if p[1] > 0]) for c, pairs in holding]
        stocked = [(c, pairs) for c, pairs in stocked if pairs]
        if len(stocked) > 1:
            raise Rejection(
                "credit_ambiguous",
                f"credit {req.credit!r} is held by several carbon classes: name one as carbonClass",
                carbonClasses=[c.symbol for c, _ in stocked],
                candidates=[
                    {
                        "carbonClass": c.symbol,
                        "tokenId": str(cr.token_id),
                        "credit": f"{cr.project_id}-{cr.vintage}",
                        "vintage": str(cr.vintage),
                        "liquidityFormatted": format_tonnes(available),
                    }
                    for c, pairs in stocked
                    for cr, available in pairs
                ],
            )
        return (stocked or holding)[0][0]

    async def _credit_not_found(self, req: ActionRequest, now: int) -> Rejection:
        """``credit_not_found`` for a credit no class registers, naming the cheapest live
        listing that sells it as ``listingId`` when there is one."""
        listings = [li for li in await self.chain.listings() if li.active and li.left_to_sell > 0]
        listings = [li for li in listings if li.expiration > now]
        credits = await self.chain.credits([li.token_id for li in listings])
        selling = sorted(
            (li for li, cr in zip(listings, credits, strict=True) if self.credit_matches(cr, req)),
            key=lambda li: (li.unit_price, li.listing_id),
        )
        if not selling:
            return Rejection("credit_not_found", f"no carbon class holds credit {req.credit!r}")
        return Rejection(
            "credit_not_found",
            f"no carbon class holds credit {req.credit!r}; listing {selling[0].listing_id} sells it",
            listingId=str(selling[0].listing_id),
        )

    async def _resolve_class(self, req: ActionRequest, wanted: str, units: int, token: Token) -> Route:
        classes = await self.chain.classes()
        chosen = next((c for c in classes if wanted.lower() in (c.symbol.lower(), str(c.class_id))), None)
        if chosen is None:
            raise Rejection(
                "no_candidates", f"no carbon class {wanted!r}", carbonClasses=[c.symbol for c in classes]
            )
        return await self._price_class(req, chosen, units, token)

    async def _price_class(self, req: ActionRequest, chosen: ClassInfo, units: int, token: Token) -> Route:
        credits = await self.chain.credits([t for t, _ in chosen.credits])
        pairs = [(cr, avail) for cr, (_, avail) in zip(credits, chosen.credits, strict=True)]
        if req.credit is not None or req.tokenId is not None:
            pairs = [p for p in pairs if self.credit_matches(p[0], req.model_copy(update={"vintage": None}))]
            if not pairs:
                raise Rejection("credit_not_found", carbonClass=chosen.symbol)
        if req.vintage is not None:
            vintages = sorted({str(cr.vintage) for cr, _ in pairs})
            pairs = [p for p in pairs if p[0].vintage == req.vintage]
            if not pairs:
                raise Rejection("vintage_not_found", availableVintages=vintages)
        pairs = [p for p in pairs if p[1] > 0]
        if not pairs:
            raise Rejection("no_candidates", carbonClass=chosen.symbol)
        if units < chosen.min_retirement_units:
            raise Rejection("amount_below_increment", minimum=format_tonnes(chosen.min_retirement_units))
        fitting = [p for p in pairs if p[1] >= units]
        if not fitting:
            raise Rejection("insufficient_liquidity", available=format_tonnes(max(a for _, a in pairs)))
        whole_ok = [p for p in fitting if not p[0].whole_tonnes_only or units % UNITS_PER_TONNE == 0]
        if not whole_ok:
            _check_whole_tonnes(fitting[0][0], units)
        credit = whole_ok[0][0]
        if self.chain.pricing_fresh():  # cache hits: one after the other, no task each
            reserves, fee_schedule = await self.chain.reserves(), await self.chain.fee_schedule()
        else:
            reserves, fee_schedule = await asyncio.gather(self.chain.reserves(), self.chain.fee_schedule())
        quote = fees.quote_class(
            chosen.price_kvcm_per_tonne, units, token.key == "usdc", reserves, fee_schedule
        )
        suggested = fees.with_slippage(quote.total, self.settings.class_slippage_bps)
        return Route(
            SOURCE_CARBON_CLASS,
            chosen.class_id,
            chosen,
            None,
            credit,
            self.contracts.carbon_credits,
            token,
            units,
            quote,
            suggested,
        )

    def quote_body(self, route: Route) -> views.QuoteAnswer:
        """The quote response (money as atomic strings plus ``…Formatted`` decimals)."""
        d = route.token.decimals
        credit = route.credit
        tonnes = format_tonnes(route.units)
        body: views.QuoteAnswer = {
            "chainId": self.chain_id,
            "inputToken": {"symbol": route.token.symbol, "address": route.token.address, "decimals": d},
            "amount": tonnes,
            "tonnesFormatted": tonnes,
            "quote": {
                "retirementCost": str(route.quote.cost),
                "fee": str(route.quote.fee),
                "total": str(route.quote.total),
            },
            "retirementPriceFormatted": format_units(route.quote.cost, d),
            "feeFormatted": format_units(route.quote.fee, d),
            "totalFormatted": format_units(route.quote.total, d),
            "suggestedMaxInput": str(route.suggested_max_input),
            "suggestedMaxInputFormatted": format_units(route.suggested_max_input, d),
            "humanSummary": (
                f"Retire {tonnes} t of {credit.project_id} (vintage {credit.vintage}, {credit.registry}) "
                f"for {format_units(route.quote.total, d)} {route.token.symbol} including a "
                f"{format_units(route.quote.fee, d)} {route.token.symbol} protocol fee."
            ),
            "resolvedCredit": {
                "creditToken": route.credit_token,
                "tokenId": str(credit.token_id),
                "projectId": credit.project_id,
                "vintage": str(credit.vintage),
                "registry": credit.registry,
            },
            "alternatives": [],
        }
        if route.carbon_class:
            body["carbonClass"] = route.carbon_class.symbol
        else:
            body["listingId"] = str(route.source_id)
        return body


def x402_fill_refusal(refusal: FillRefusal, listing_id: int, credit: CreditInfo | None) -> Rejection:
    """The x402 surface's refusal of a fill (its spec's codes: a cancelled listing is
    ``listing_not_found``, a sold-out one ``insufficient_listing_supply``)."""
    reason = refusal.reason
    if reason is Unfillable.CANCELLED:
        return Rejection("listing_not_found", listingId=str(listing_id))
    if reason is Unfillable.EXPIRED:
        return Rejection("listing_expired", listingId=str(listing_id), expiration=refusal.expiration)
    if reason in (Unfillable.SOLD_OUT, Unfillable.INSUFFICIENT_SUPPLY):
        return Rejection("insufficient_listing_supply", leftToSell=format_tonnes(refusal.left_to_sell))
    if reason is Unfillable.BELOW_MIN_FILL:
        return Rejection("below_min_fill", minFill=format_tonnes(refusal.min_fill))
    return Rejection("amount_not_whole_tonnes", registry=credit.registry if credit else "", increment="1")


def _check_whole_tonnes(credit: CreditInfo, units: int) -> None:
    if credit.whole_tonnes_only and units % UNITS_PER_TONNE:
        raise Rejection("amount_not_whole_tonnes", registry=credit.registry, increment="1")
