"""Attribution of a retirement: who retires, for whom, and the consumption metadata a
whole-tonne registry requires (spec: Rules 4-6; errors attribution_required,
registry_details_required). Pure."""

from __future__ import annotations

from typing import Final

from relayer.domain.errors import Rejection
from relayer.domain.retirement import RetirementDetails
from relayer.domain.schemas import Details

CONSUMPTION_FIELDS: Final = (
    "beneficiaryLocation",
    "consumptionCountryCode",
    "consumptionPeriodStart",
    "consumptionPeriodEnd",
)


def retirement_details(
    details: Details | None, payer: str, *, consumption_metadata_required: bool, registry: str
) -> RetirementDetails:
    """The contract's details struct for a retirement paid by ``payer``.

    Args:
        details: the request's ``details`` (None when absent).
        payer: checksummed payer, which is always the retiring address.
        consumption_metadata_required: the credit's registry needs consumption metadata.
        registry: the credit's registry code, named in the error.

    Raises:
        Rejection: ``attribution_required`` (no beneficiary named), ``schema_validation``
            (``retiringAddress`` other than the payer), ``registry_details_required``
            (consumption metadata missing; ``fields`` names them).
    """
    d = details.model_dump(exclude_none=True) if details else {}
    if d.get("beneficiaryIsPayer"):
        beneficiary = payer
    elif d.get("beneficiaryAddress"):
        beneficiary = d["beneficiaryAddress"]
    else:
        raise Rejection(
            "attribution_required", fields=["details.beneficiaryAddress", "details.beneficiaryIsPayer"]
        )
    if d.get("retiringAddress", payer) != payer:
        raise Rejection(
            "schema_validation",
            "details.retiringAddress must equal from",
            issues=[{"path": ["details", "retiringAddress"], "keys": [], "message": "must equal from"}],
        )
    missing = [f for f in CONSUMPTION_FIELDS if consumption_metadata_required and not d.get(f)]
    if missing:
        raise Rejection(
            "registry_details_required", fields=[f"details.{f}" for f in missing], registry=registry
        )
    return RetirementDetails(
        retiring_address=payer,
        beneficiary_address=beneficiary,
        beneficiary_string=d.get("beneficiaryString", ""),
        retiring_entity_string=d.get("retiringEntityString", ""),
        retirement_message=d.get("retirementMessage", ""),
        beneficiary_location=d.get("beneficiaryLocation", ""),
        consumption_country_code=d.get("consumptionCountryCode", ""),
        consumption_period_start=d.get("consumptionPeriodStart", ""),
        consumption_period_end=d.get("consumptionPeriodEnd", ""),
    )
