"""The terms of a retirement: resolve and price the route a request names (catalogue
reads), attribute it, and build the retirement the payer signs and the verifier checks.
Spec: quote, prepare-auth, actions/retire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relayer.domain.amounts import format_tonnes
from relayer.domain.attribution import retirement_details
from relayer.domain.retirement import Retirement, RetirementDetails
from relayer.domain.schemas import ActionRequest, Details, require
from relayer.domain.verify import Terms
from relayer.service.supply import Route, Supply


@dataclass(frozen=True, slots=True)
class Resolved:
    """A priced route with its attribution, for the payer ``payer`` (checksummed)."""

    payer: str
    route: Route
    details: RetirementDetails

    def retirement(self, gas_allowance: int) -> Retirement:
        """The retirement as the settlement sees it (``gas_allowance`` in input-token atomic
        units; 0 on the caller-paid path)."""
        route = self.route
        return Retirement(
            source=route.source,
            source_id=route.source_id,
            credit_token=route.credit_token,
            token_id=route.credit.token_id,
            amount=route.units,
            input_token=route.token.address,
            gas_allowance=gas_allowance,
            details=self.details,
        )

    def summary(self, gas_allowance: int) -> dict[str, Any]:
        """What is being retired, as echoed to callers (``submitted``)."""
        route = self.route
        return {
            "source": "carbonClass" if route.carbon_class else "listing",
            "carbonClass": route.carbon_class.symbol if route.carbon_class else None,
            "listingId": None if route.carbon_class else str(route.source_id),
            "creditToken": route.credit_token,
            "tokenId": str(route.credit.token_id),
            "amount": format_tonnes(route.units),
            "inputToken": route.token.symbol,
            "payer": self.payer,
            "beneficiaryAddress": self.details.beneficiary_address,
            "gasAllowance": str(gas_allowance),
        }

    def terms(self, chain_id: int, settlement: str, gas_allowance: int) -> Terms:
        """The verifier's terms for an authorization carrying ``gas_allowance``."""
        return Terms(
            chain_id=chain_id,
            settlement=settlement,
            scheme=self.route.token.scheme,
            input_token=self.route.token.address,
            retirement=self.retirement(gas_allowance),
            total=self.route.quote.total,
            summary=self.summary(gas_allowance),
        )


async def resolve(supply: Supply, request: ActionRequest, now: int) -> Resolved:
    """Resolve, price and attribute the retirement ``request`` describes.

    Raises:
        Rejection: schema_validation (no ``from``), the quote codes, attribution_required,
            registry_details_required.
        Unavailable: the chain node failed.
    """
    require(request, "from")
    assert request.from_ is not None
    return attribute(await supply.resolve(request, now), request.from_, request.details)


def attribute(route: Route, payer: str, details: Details | None) -> Resolved:
    """Attribute a priced ``route`` paid by ``payer`` (checksummed): the typed twin of
    :func:`resolve` for callers that resolved the route themselves (marketplace orders).

    Raises:
        Rejection: attribution_required, registry_details_required, schema_validation.
    """
    attribution = retirement_details(
        details,
        payer,
        consumption_metadata_required=route.credit.requires_consumption_metadata,
        registry=route.credit.registry,
    )
    return Resolved(payer, route, attribution)
