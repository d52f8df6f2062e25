"""The error registry: every error code either surface can answer (the x402 endpoint and
the marketplace API), each with one HTTP status, group, retryability and default message.
Source: x402-retirement-endpoint.md, section Errors (its codes and statuses), and the
marketplace API's own codes (marketplace-api.md, Errors), which answer the same status for
the same code.

One error tree: :class:`RelayerError` is the root of every error raised on purpose, each
with a registered code and a transient flag; :class:`Rejection` is an expected refusal of a
request, :class:`Unavailable` an upstream outage. Only the API layer shapes a surface's
error body and sets the HTTP status (the registry's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal

X402_FACILITATOR_VERSION: Final = 2


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One row of the error table: a code and the one HTTP status it answers on every
    surface. ``surface`` is ``"x402"`` for the x402 spec's codes (and its declared
    extensions), which the marketplace API answers too; ``"marketplace"`` for a code only
    the marketplace API answers (never published as an x402 code); ``"facilitator"`` for a
    code only the x402 facilitator (``/facilitator``) answers."""

    code: str
    http_status: int
    group: str
    retryable: bool
    message: str
    surface: Literal["x402", "marketplace", "facilitator"] = "x402"


def _marketplace(code: str, http_status: int, group: str, retryable: bool, message: str) -> ErrorSpec:
    return ErrorSpec(code, http_status, group, retryable, message, "marketplace")


def _facilitator(code: str, http_status: int, group: str, retryable: bool, message: str) -> ErrorSpec:
    return ErrorSpec(code, http_status, group, retryable, message, "facilitator")


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
    # not in the spec's table: the operator's per-client rate limit (release 1.2.0, additive)
    ErrorSpec(
        "rate_limited",
        429,
        "request",
        True,
        "Too many requests from this client; retry after `retryAfterSeconds`.",
    ),
    # not in the spec's table: a known path asked with a method it does not serve (additive)
    ErrorSpec(
        "method_not_allowed", 405, "request", False, "The path serves other methods; see `allow` and Allow."
    ),
    # The marketplace API's own codes (marketplace-api.md); it answers the x402 codes above
    # too (listing_not_found, listing_expired, below_min_fill, schema_validation, ...) with
    # their statuses.
    _marketplace("invalid_retirement_id", 400, "request", False, "Not a {chainId}-{txHash}-{index} id."),
    _marketplace("not_a_listing", 400, "request", False, "`asset_price_source_id` names no seller listing."),
    _marketplace("parameter_removed", 400, "request", False, "A parameter removed in release v18."),
    _marketplace("endpoint_removed", 410, "request", False, "An endpoint removed in release v18."),
    _marketplace("endpoint_replaced", 410, "request", False, "Replaced in release v18; see `replacement`."),
    _marketplace("invalid_category", 400, "request", False, "Not a category of GET /categories."),
    _marketplace("invalid_quantity", 400, "amount", False, "Tonnes above 0 with at most 3 decimals."),
    _marketplace("unsupported_chain", 400, "resolution", False, "The chain is not served here."),
    _marketplace("unauthorized", 401, "authorization", False, "A valid API key is required."),
    _marketplace(
        "gas_budget_exhausted",
        429,
        "authorization",
        True,
        "The API key's daily gas budget is spent; retry after `retryAfterSeconds` (the next UTC day).",
    ),
    _marketplace("project_not_found", 404, "resolution", False, "No project with that key."),
    _marketplace("order_not_found", 404, "resolution", False, "No order with that id for this key."),
    _marketplace("quote_not_found", 404, "resolution", False, "No quote with that id for this key."),
    _marketplace("listing_cancelled", 409, "resolution", False, "The listing was cancelled."),
    _marketplace("listing_sold_out", 409, "resolution", False, "The listing is sold out."),
    _marketplace("quote_mismatch", 400, "request", False, "The order names another listing than its quote."),
    _marketplace("quote_consumed", 409, "resolution", False, "The quote was already used by an order."),
    _marketplace("quote_expired", 409, "resolution", False, "The quote has expired; ask for a new one."),
    _marketplace("quote_outdated", 409, "resolution", False, "The listing's price changed since the quote."),
    _marketplace(
        "consumption_metadata_required", 400, "amount", False, "The registry needs `consumption_metadata`."
    ),
    _marketplace("orders_unavailable", 503, "upstream", True, "This operator takes no orders."),
    _marketplace("timeout", 503, "request", True, "The request ran past the time limit; retry with backoff."),
    # The x402 facilitator's own refusals (docs/design/x402-v2.md C2; the payment-identifier
    # extension's "same id, different payload": 409 Conflict)
    _facilitator(
        "payment_identifier_conflict",
        409,
        "request",
        False,
        "This payment identifier was already used with another payment payload.",
    ),
)

REGISTRY: Final[Mapping[str, ErrorSpec]] = MappingProxyType({row.code: row for row in _ROWS})
"""Every code of either surface (one status per code)."""
X402_REGISTRY: Final[Mapping[str, ErrorSpec]] = MappingProxyType(
    {row.code: row for row in _ROWS if row.surface == "x402"}
)
"""The x402 endpoint's codes, in the spec's order: what its manifest and errors document publish."""


class RelayerError(Exception):
    """Root of every error this project raises on purpose.

    Each carries a registered spec ``code`` (a key of :data:`REGISTRY`), a human
    ``message`` (callers match on the code, never on this), JSON-serialisable ``context``
    fields for the error body, and ``transient``: True when the same operation may succeed
    later unchanged (a node or database outage, a liquidity move), False when something
    must change first. Only the API layer shapes the body and sets the HTTP status
    (``relayer.api.errors``).

    Args:
        code: a key of :data:`REGISTRY`; defaults to the class's ``default_code``.
        message: overrides the registry's default message.
        transient: overrides the default, which is the code's ``retryable`` column.
        **context: extra fields of the error body.

    Raises:
        KeyError: the code is not registered (a programming error).
    """

    default_code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        code: str | None = None,
        message: str | None = None,
        *,
        transient: bool | None = None,
        **context: Any,
    ) -> None:
        self.code = code or self.default_code
        self.spec = REGISTRY[self.code]
        self.message = message or self.spec.message
        self.transient = self.spec.retryable if transient is None else transient
        self.context = context
        super().__init__(f"{self.code}: {self.message}")

    def record(self) -> dict[str, Any]:
        """``{code, message, context}``: how a job row stores this error (no HTTP in it)."""
        return {"code": self.code, "message": self.message, "context": self.context}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RelayerError:
        """Rebuild an error stored by :meth:`record` (unknown codes become internal_error)."""
        code = str(record.get("code", ""))
        if code not in REGISTRY:
            return cls("internal_error")
        return cls(code, record.get("message"), **dict(record.get("context") or {}))


class Rejection(RelayerError):
    """An expected refusal of a request: a registered code and code-specific context.

    Args:
        code: a key of :data:`REGISTRY`.
        message: human text (callers match on ``code``, never on this).
        **context: extra JSON-serialisable fields for the error body.

    Raises:
        KeyError: the code is not registered (a programming error).
    """

    def __init__(self, code: str, message: str | None = None, **context: Any) -> None:
        super().__init__(code, message, **context)


class Unavailable(RelayerError):
    """An upstream the daemon depends on (the chain node, the database) failed or did not
    answer in time. Always transient; answers the spec's retryable 503
    ``gas_estimate_unavailable`` (nothing was attempted) with ``upstream`` naming which
    one, never 500. The default message carries no host, DSN or driver text."""

    default_code: ClassVar[str] = "gas_estimate_unavailable"
    upstream: ClassVar[str] = "upstream"

    def __init__(self, message: str | None = None, *, detail: str | None = None, **context: Any) -> None:
        """``detail`` says what failed (an exception's class name) for logs only; it never
        reaches an error body."""
        super().__init__(
            None,
            message or f"The {self.upstream} is unavailable; nothing was attempted. Retry with backoff.",
            transient=True,
            upstream=self.upstream,
            **context,
        )
        self.detail = detail


COMMON_CODES: Final = (
    "invalid_json",
    "unknown_action",
    "not_found",
    "document_not_found",
    "schema_validation",
    "internal_error",
    "rate_limited",  # release 1.2.0: the per-client rate limit, on any route
    "method_not_allowed",  # a known path asked with another method: 405 with Allow
)
"""Codes every action can return (spec: Errors, "Codes specific to each action"; plus the
rate limit of release 1.2.0)."""

_QUOTE_CODES: Final = (
    "unsupported_chain_id",
    "unsupported_input_token",
    "no_candidates",
    "credit_not_found",
    "credit_ambiguous",
    "vintage_not_found",
    "insufficient_liquidity",
    "amount_not_whole_tonnes",
    "amount_below_increment",
    "contract_revert",
    "listing_not_found",
    "listing_expired",
    "below_min_fill",
    "insufficient_listing_supply",
    "marketplace_requires_usdc",
)
_PREPARE_CODES: Final = (*_QUOTE_CODES, "registry_details_required")
_PREPARE_AUTH_CODES: Final = (*_PREPARE_CODES, "attribution_required", "gas_estimate_unavailable")

ACTION_CODES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "discover": (),
        "quote": _QUOTE_CODES,
        "prepare/retire": _PREPARE_CODES,
        "prepare-auth": _PREPARE_AUTH_CODES,
        "actions/retire": (
            *_PREPARE_AUTH_CODES,
            "invalid_input_token",
            "payment_required",
            "invalid_auth_payload",
            "insufficient_authorized_value",
            "params_mismatch",
            "transaction_reverted",
            "gas_limit_exceeds_cap",
            # not in the spec's per-action table: the executor's balance floor (operator
            # payment configuration unusable), declared in the manifest and the changelog
            "payment_unavailable",
        ),
        "certificate": ("retirement_not_found",),
    }
)
"""The codes each action can return beside :data:`COMMON_CODES` (spec: Errors): the one
source of the manifest's per-action lists and of what the API lets out of each action."""


def allowed_codes(action: str) -> tuple[str, ...]:
    """Every code ``action`` may answer: its own and the common ones."""
    return (*ACTION_CODES.get(action, ()), *COMMON_CODES)
