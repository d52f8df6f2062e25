"""The discover action (spec: discover): the carbon classes and marketplace listings with
supply on this chain, filtered as the request asks, read from live chain state through
:class:`~relayer.service.supply.Supply` (whose credit filters and project records it shares
with quoting). Amounts in tonnes and USDC as the spec's decimal strings."""

from __future__ import annotations

import asyncio
from typing import Any

from relayer.chain.types import ClassInfo, CreditInfo
from relayer.domain import fees, views
from relayer.domain.amounts import (
    KVCM_DECIMALS,
    UNITS_PER_TONNE,
    USDC_DECIMALS,
    format_tonnes,
    format_units,
    parse_units,
)
from relayer.domain.marketplace import ListingInfo
from relayer.domain.schemas import ActionRequest
from relayer.service.supply import Supply


class Discover:
    """discover over one chain's supply."""

    def __init__(self, supply: Supply) -> None:
        self.supply = supply

    async def discover(self, req: ActionRequest, now: int) -> views.DiscoverAnswer:
        """``carbonClasses[]`` and ``marketplaceListings[]`` (active, unexpired, with supply).

        Raises:
            Rejection: ``schema_validation`` (a ``chainId`` not served here).
            Unavailable: the chain node failed, or (a country, category or methodology filter)
                the catalogue database (``StoreUnavailable``).
        """
        self.supply.check_chain_field(req.chainId)
        await self.supply.project_records(req)
        if self.supply.chain.catalog_fresh():  # cache hits: one after the other, no task each
            classes, listings = await self.supply.chain.classes(), await self.supply.chain.listings()
            reserves, fee_schedule = (
                await self.supply.chain.reserves(),
                await self.supply.chain.fee_schedule(),
            )
        else:
            classes, listings, reserves, fee_schedule = await asyncio.gather(
                self.supply.chain.classes(),
                self.supply.chain.listings(),
                self.supply.chain.reserves(),
                self.supply.chain.fee_schedule(),
            )
        token_ids = sorted({t for c in classes for t, _ in c.credits} | {li.token_id for li in listings})
        credits = dict(zip(token_ids, await self.supply.chain.credits(token_ids), strict=True))
        max_price = (
            None if req.maxUsdcPricePerTonne is None else parse_units(req.maxUsdcPricePerTonne, USDC_DECIMALS)
        )
        out_classes = []
        if req.source in (None, "carbonClass", "carbonClasses"):
            out_classes = [
                view
                for c in classes
                if (view := self._class_view(c, credits, reserves, req, max_price)) is not None
            ]
        out_listings = []
        if req.source in (None, "listing", "marketplace", "marketplaceListings"):
            out_listings = [
                self.listing_view(li, credits[li.token_id])
                for li in listings
                if self._listing_matches(li, credits[li.token_id], req, max_price, now)
            ]
        return {
            "chainId": self.supply.chain_id,
            "carbonClasses": out_classes,
            "marketplaceListings": out_listings,
            "marketplaceEnabled": True,
            "supportedInputTokens": [
                {"symbol": t.symbol, "address": t.address, "decimals": t.decimals}
                for t in self.supply.tokens.values()
            ],
            "protocolFee": {
                "classFeeBps": fee_schedule.class_fee_bps,
                "classFeeFloorUsdc": str(fee_schedule.class_fee_floor_usdc),
                "listingFeeBps": fee_schedule.listing_fee_bps,
                "listingFeeFloorUsdc": str(fee_schedule.listing_fee_floor_usdc),
            },
        }

    def _class_view(
        self,
        c: ClassInfo,
        credits: dict[int, CreditInfo],
        reserves: fees.PoolReserves,
        req: ActionRequest,
        max_price: int | None,
    ) -> dict[str, Any] | None:
        """A class as discover lists it, or None when the request's filters exclude it."""
        if req.carbonClass and req.carbonClass.lower() not in (c.symbol.lower(), str(c.class_id)):
            return None
        per_tonne = fees.pool_amount_in(
            fees.class_cost_kvcm(c.price_kvcm_per_tonne, UNITS_PER_TONNE), reserves.usdc, reserves.kvcm
        )
        if max_price is not None and per_tonne > max_price:
            return None
        detailed = [
            self._credit_view(credits[t], a)
            for t, a in c.credits
            if self.supply.credit_matches(credits[t], req)
        ]
        if not detailed and _has_credit_filter(req):
            return None
        return {
            "carbonClassId": c.symbol,
            "classId": c.class_id,
            "name": c.name,
            "priceKvcmPerTonne": str(c.price_kvcm_per_tonne),
            "priceKvcmPerTonneFormatted": format_units(c.price_kvcm_per_tonne, KVCM_DECIMALS),
            "priceUsdcPerTonne": str(per_tonne),
            "priceUsdcPerTonneFormatted": format_units(per_tonne, USDC_DECIMALS),
            "minRetirementTonnesFormatted": format_tonnes(c.min_retirement_units),
            "inputTokens": ["USDC", "kVCM"],
            "creditsDetailed": detailed,
        }

    def _listing_matches(
        self, li: ListingInfo, credit: CreditInfo, req: ActionRequest, max_price: int | None, now: int
    ) -> bool:
        """Whether discover lists ``li``: live (active, supply left, unexpired) and passing the filters."""
        if not li.active or li.left_to_sell == 0 or li.expiration <= now:
            return False
        if req.listingId is not None and li.listing_id != req.listingId:
            return False
        return self.supply.credit_matches(credit, req) and (max_price is None or li.unit_price <= max_price)

    def _credit_view(self, credit: CreditInfo, available: int) -> dict[str, Any]:
        return {
            "tokenAddress": self.supply.contracts.carbon_credits,
            "tokenId": str(credit.token_id),
            "credit": f"{credit.project_id}-{credit.vintage}",
            "registry": credit.registry,
            "vintage": str(credit.vintage),
            "projectId": credit.project_id,
            "liquidityFormatted": format_tonnes(available),
            "wholeTonnesOnly": credit.whole_tonnes_only,
            "requiresConsumptionMetadata": credit.requires_consumption_metadata,
        }

    def listing_view(self, li: ListingInfo, credit: CreditInfo) -> dict[str, Any]:
        return {
            "listingId": str(li.listing_id),
            "seller": li.seller,
            "creditToken": li.credit_token,
            "tokenId": str(li.token_id),
            "credit": f"{credit.project_id}-{credit.vintage}",
            "projectId": credit.project_id,
            "vintage": str(credit.vintage),
            "registry": credit.registry,
            "priceUsdcPerTonne": str(li.unit_price),
            "priceUsdcPerTonneFormatted": format_units(li.unit_price, USDC_DECIMALS),
            "leftToSell": format_tonnes(li.left_to_sell),
            "minFill": format_tonnes(li.min_fill),
            "expiration": li.expiration,
            "source": "marketplace",
        }


def _has_credit_filter(req: ActionRequest) -> bool:
    filters = (req.tokenId, req.vintage, req.project, req.credit, req.country, req.category, req.methodology)
    return any(v is not None for v in filters)
