"""The error registry: every error code the API can answer, with its HTTP status, group,
retryability and default message. Source: x402-retirement-endpoint.md, section Errors.

Expected rejections are raised as :class:`Rejection` carrying a registered code and
code-specific context; only the API layer turns them into HTTP responses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

X402_FACILITATOR_VERSION: Final = 2


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One row of the spec's error table."""

    code: str
    http_status: int
    group: str
    retryable: bool
    message: str


_ROWS: Final[tuple[ErrorSpec, ...]] = (
    ErrorSpec(
        "invalid_json",
        400,
        "request",
        False,
        "Body is not parseable JSON; one JSON object is expected, not form fields.",
    ),
    ErrorSpec("unknown_action", 400, "request", False, "`action` missing or unsupported."),
    ErrorSpec("not_found", 404, "request", False, "No route at the path."),
    ErrorSpec("document_not_found", 404, "request", False, "No guide document for `id`."),
    ErrorSpec("schema_validation", 400, "request", False, "Body failed validation."),
    ErrorSpec("internal_error", 500, "request", True, "Unhandled server failure; retry with backoff."),
    ErrorSpec(
        "marketplace_requires_usdc", 400, "request", False, "Marketplace listing fills accept USDC only."
    ),
    ErrorSpec("unsupported_chain_id", 400, "resolution", False, "`chainId` is not served here."),
    ErrorSpec(
        "unsupported_input_token",
        400,
        "resolution",
        False,
        "`inputToken` is not an accepted token on the chain.",
    ),
    ErrorSpec(
        "invalid_input_token",
        400,
        "resolution",
        False,
        "Token matches neither the EIP-3009 USDC nor the EIP-2612 kVCM path.",
    ),
    ErrorSpec("no_candidates", 404, "resolution", True, "No credit in the class matched, or it is empty."),
    ErrorSpec("credit_not_found", 404, "resolution", True, "No credit with that id in any class."),
    ErrorSpec("credit_ambiguous", 409, "resolution", False, "The credit id maps to several routes."),
    ErrorSpec("vintage_not_found", 400, "resolution", False, "No credit with that vintage."),
    ErrorSpec("listing_not_found", 404, "resolution", False, "No such listing, or cancelled."),
    ErrorSpec("listing_expired", 422, "resolution", False, "Listing expired or deactivated."),
    ErrorSpec("insufficient_liquidity", 422, "amount", True, "Pool cannot fill the amount now."),
    ErrorSpec(
        "amount_not_whole_tonnes",
        422,
        "amount",
        False,
        "Registry retires whole tonnes only and `amount` has a fraction.",
    ),
    ErrorSpec("amount_below_increment", 422, "amount", False, "`amount` below the credit's minimum unit."),
    ErrorSpec(
        "registry_details_required",
        400,
        "amount",
        False,
        "Registry consumption metadata missing from `details`.",
    ),
    ErrorSpec("below_min_fill", 422, "amount", False, "Below the listing's own `minFill`."),
    ErrorSpec("insufficient_listing_supply", 422, "amount", True, "Listing has less than requested."),
    ErrorSpec(
        "payment_required",
        402,
        "authorization",
        False,
        "Sign `typedData` and post `actionsRetireRequest` back with the signature.",
    ),
    ErrorSpec(
        "attribution_required", 400, "authorization", False, "Relayed retirement named no beneficiary."
    ),
    ErrorSpec("invalid_auth_payload", 400, "authorization", False, "Authorization structurally wrong."),
    ErrorSpec(
        "insufficient_authorized_value",
        400,
        "authorization",
        False,
        "Signed `value` no longer covers retirement, fee and gas; re-run prepare-auth and re-sign.",
    ),
    ErrorSpec(
        "params_mismatch",
        400,
        "authorization",
        False,
        "Submitted retirement differs from the authorized one.",
    ),
    ErrorSpec("contract_revert", 422, "settlement", True, "Simulation reverted; nothing was broadcast."),
    ErrorSpec(
        "transaction_reverted",
        422,
        "settlement",
        True,
        "Relayed transaction mined and reverted; re-run prepare-auth and re-sign.",
    ),
    ErrorSpec(
        "retirement_not_found",
        404,
        "settlement",
        True,
        "No indexed retirement for the hash; poll every few seconds.",
    ),
    ErrorSpec(
        "gas_estimate_unavailable",
        503,
        "upstream",
        True,
        "Executor gas could not be priced; nothing attempted.",
    ),
    ErrorSpec(
        "gas_limit_exceeds_cap",
        503,
        "upstream",
        True,
        "Simulated gas exceeds the executor's configured ceiling; nothing broadcast.",
    ),
    ErrorSpec("payment_unavailable", 503, "upstream", True, "Operator payment configuration is missing."),
)

REGISTRY: Final[Mapping[str, ErrorSpec]] = MappingProxyType({row.code: row for row in _ROWS})


class Rejection(Exception):
    """An expected rejection with a registered error code and code-specific context.

    Args:
        code: a key of :data:`REGISTRY`.
        message: human text (callers match on ``code``, never on this).
        **context: extra JSON-serialisable fields for the error body.

    Raises:
        KeyError: the code is not registered (a programming error).
    """

    def __init__(self, code: str, message: str | None = None, **context: Any) -> None:
        spec = REGISTRY[code]
        self.code = code
        self.spec = spec
        self.message = message or spec.message
        self.context = context
        super().__init__(f"{code}: {self.message}")

    def body(self) -> dict[str, Any]:
        """The spec's error envelope ``{error, message, x402FacilitatorVersion, ...}``."""
        return {
            **self.context,
            "error": self.code,
            "message": self.message,
            "x402FacilitatorVersion": X402_FACILITATOR_VERSION,
        }
