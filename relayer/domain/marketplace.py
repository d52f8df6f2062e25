"""The marketplace catalogue API's pure rules (spec: marketplace-api.md, release v18): the
unified retirement id, listing price source ids, strict request models (unknown keys are
errors; they also generate the OpenAPI document), bounded pagination, the removed and
replaced endpoints, the refusals (registry codes: :mod:`relayer.domain.errors`), the listing
state folded from its events, and the provenance walk over indexed credit transfers.

Units: credit amounts in credit units (1 unit = 1 kg CO2e, 1000 = 1 tonne); USDC in atomic
units (6 decimals); times in unix seconds. Tonnes cross the wire as decimal strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from relayer.domain.addresses import checksum_address
from relayer.domain.amounts import USDC_DECIMALS, TonnesFault, format_units, read_tonnes
from relayer.domain.errors import Rejection
from relayer.domain.models import CountryCode, IsoDate, StrictModel, field_problems
from relayer.domain.projects import CATEGORIES

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 100
"""Page sizes of every list endpoint (``limit``; ``offset`` counts items skipped)."""
MAX_OFFSET: Final = 1_000_000
MAX_PROVENANCE_STEPS: Final = 32
"""A provenance walk stops after this many transfers back from the retirement."""
ZERO_ADDRESS: Final = "0x" + "0" * 40
_M = TypeVar("_M", bound=BaseModel)

RETIREMENT_ID_PATTERN: Final = r"^([1-9][0-9]{0,9})-(0x[0-9a-fA-F]{64})-(0|[1-9][0-9]{0,8})$"
"""A unified retirement id, ``{chainId}-{txHash}-{retirementIndex}`` (JSON Schema's pattern)."""
_RETIREMENT_ID: Final = re.compile(RETIREMENT_ID_PATTERN.strip("^$"))
SOURCE_ID: Final = re.compile(r"listing-([1-9][0-9]{0,9})-(0x[0-9a-fA-F]{64})")
"""A listing's price source id: group 1 the chain id, group 2 the listing id as ``0x`` + 64 hex."""
_ADDRESS_LIKE: Final = re.compile(r"0x[0-9a-fA-F]{40}")


# ---------------------------------------------------------------------------- errors


def bad_request(code: str, message: str, **context: Any) -> Rejection:
    """A refusal of a marketplace request with registry ``code`` (its status is the
    registry's: 400 for most request faults, 422 for ``below_min_fill`` and
    ``amount_not_whole_tonnes`` as on the x402 endpoint).

    Raises:
        KeyError: ``code`` is not registered (a programming error).
    """
    return Rejection(code, message, **context)


def not_found(what: str, value: str) -> Rejection:
    """404 ``<what>_not_found`` (``project``, ``retirement``, ``listing``, ``quote``,
    ``order``) echoing ``value`` as the field ``<what>``."""
    return Rejection(f"{what}_not_found", f"no {what.replace('_', ' ')} {value!r}", **{what: value})


# ---------------------------------------------------------------------------- identifiers


@dataclass(frozen=True, slots=True)
class RetirementId:
    """``{chainId}-{txHash}-{retirementIndex}``: the unified retirement id (spec: Endpoints)."""

    chain_id: int
    tx_hash: bytes
    index: int

    def __str__(self) -> str:
        return f"{self.chain_id}-0x{self.tx_hash.hex()}-{self.index}"


def parse_retirement_id(text: str) -> RetirementId:
    """Parse a unified retirement id (the hash in any case; printed in lower case).

    Raises:
        Rejection: 400 ``invalid_retirement_id`` naming the format.
    """
    match = _RETIREMENT_ID.fullmatch(text)
    if match is None:
        raise bad_request(
            "invalid_retirement_id",
            "a retirement id is {chainId}-{transactionHash}-{retirementIndex}, e.g. "
            f"84532-0x{'ab' * 32}-0 (take it from GET /retirements)",
            id=text[:200],
        )
    return RetirementId(int(match[1]), bytes.fromhex(match[2][2:]), int(match[3]))


@dataclass(frozen=True, slots=True)
class SourceId:
    """A listing's price source id, ``listing-<chainId>-0x<listing id as 64 hex digits>``."""

    chain_id: int
    listing_id: int

    def __str__(self) -> str:
        return f"listing-{self.chain_id}-0x{self.listing_id:064x}"


def parse_source_id(text: str) -> SourceId:
    """Parse an ``asset_price_source_id``. Only seller listings exist in v18 (spec: Rules 3,
    Errors): anything else is refused.

    Raises:
        Rejection: 400 ``not_a_listing`` (a pool, product or malformed source).
    """
    match = SOURCE_ID.fullmatch(text)
    if match is None:
        raise bad_request(
            "not_a_listing",
            "asset_price_source_id must name a seller listing: listing-<chainId>-0x<64 hex digits> "
            "(take it from GET /prices); carbon pool and product sources were removed in v18",
            asset_price_source_id=text[:200],
        )
    return SourceId(int(match[1]), int(match[2], 16))


def looks_like_address(text: str) -> bool:
    return _ADDRESS_LIKE.fullmatch(text) is not None


# ---------------------------------------------------------------------------- removed endpoints


@dataclass(frozen=True, slots=True)
class Removed:
    """An endpoint or parameter removed or replaced in v18 and what replaces it."""

    what: str
    replacement: str

    def error(self) -> Rejection:
        """410 ``endpoint_replaced`` naming the ``replacement``, or 410 ``endpoint_removed``."""
        replaced = self.replacement != ""
        return Rejection(
            "endpoint_replaced" if replaced else "endpoint_removed",
            f"{self.what} was {'replaced' if replaced else 'removed'} in release v18"
            + (f"; use {self.replacement}" if replaced else ""),
            replacement=self.replacement or None,
        )


REMOVED_PRODUCTS: Final = Removed(
    "GET /products", "GET /prices (seller listings) and GET /carbonProjects (projects with their listings)"
)
REPLACED_RETIREMENT: Final = {
    "": Removed("GET /retirements/{beneficiaryAddress}/{retirementIndex}", "GET /retirements/{id}"),
    "certificate": Removed(
        "GET /retirements/{beneficiaryAddress}/{retirementIndex}/certificate",
        "GET /retirements/{id}/certificate",
    ),
    "provenance": Removed(
        "GET /retirements/{beneficiaryAddress}/{retirementIndex}/provenance",
        "GET /retirements/{id}/provenance",
    ),
}
REMOVED_PRICE_PARAMETERS: Final = {
    "productIds": "none: products were removed; prices are seller listings only",
    "hasAssetPriceType": "none: every price is a seller listing (type listing)",
    "isDefaultCredit": "none: filter by projectKey or chainId",
}
REMOVED_QUOTE_FIELDS: Final = {
    "listing_id": "asset_price_source_id (listing-<chainId>-0x<64 hex>, from GET /prices)",
    "pool": "none: pool quotes were removed; quote a seller listing by asset_price_source_id",
    "credit_token_address": "asset_price_source_id (the listing names its credit)",
}


def removed_parameters(given: Iterable[str], table: dict[str, str], where: str) -> Rejection | None:
    """400 ``parameter_removed`` naming each removed parameter (or body field) given and its
    replacement; None when none was given."""
    hits = sorted(k for k in given if k in table)
    if not hits:
        return None
    return bad_request(
        "parameter_removed",
        f"{', '.join(hits)} {'was' if len(hits) == 1 else 'were'} removed from {where} in release v18",
        removed={k: table[k] for k in hits},
    )


# ---------------------------------------------------------------------------- request models

ADDRESS_SCHEMA: Final = {
    "type": "string",
    "pattern": "^0x([0-9a-f]{39}[1-9a-f]|[0-9A-F]{39}[1-9A-F])$",
    "minLength": 42,
    "maxLength": 42,
    "description": "an address in one case, not ending in 0 (so never the zero address); any other "
    "address is accepted too, in one case or with its EIP-55 checksum",
}
"""The JSON Schema of an address field: the form every address takes without a checksum
(a checksummed mixed-case one is accepted too, but no pattern can check a checksum)."""
_Address = Annotated[str, WithJsonSchema(ADDRESS_SCHEMA)]
_Text = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200, strip_whitespace=True, pattern=r"^[^\x00-\x1f\x7f]*$"),
]
"""A filter's text: no control characters (Postgres text holds no NUL)."""
_Category = Annotated[_Text, WithJsonSchema({"type": "string", "enum": list(CATEGORIES)})]
"""A category of GET /categories (matched without regard to case)."""
_Vintage = Annotated[str, StringConstraints(pattern=r"^[0-9]{4}$")]
_Sdg = Annotated[str, StringConstraints(pattern=r"^([1-9]|1[0-7])$")]
_Tonnes = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,11})(\.[0-9]{1,3})?$")]


class _Strict(StrictModel):
    model_config = ConfigDict(str_strip_whitespace=True)


class Page(_Strict):
    """``offset`` (items skipped, default 0) and ``limit`` (page size, 1-100, default 20)."""

    offset: int = Field(default=0, ge=0, le=MAX_OFFSET)
    limit: int = Field(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT)


class CarbonProjectsQuery(Page):
    """Query of GET /carbonProjects. ``country`` and ``category`` combine: a project must match
    both (case-insensitive; ``category`` must be one of GET /categories). ``search`` matches
    name, key or description; ``minSupply`` is in tonnes; ``minPriceUSD`` and ``maxPriceUSD``
    bound the cheapest live listing's USDC price per tonne (projects without one are left out
    when either is given)."""

    country: _Text | None = None
    category: _Category | None = None
    search: _Text | None = None
    vintage: _Vintage | None = None
    sdg: _Sdg | None = None
    registry: _Text | None = None
    minSupply: _Tonnes | None = None
    minPriceUSD: _Tonnes | None = None
    maxPriceUSD: _Tonnes | None = None


class RetirementsQuery(Page):
    """Query of GET /retirements: both chains unless ``chainId`` picks one; newest first."""

    chainId: int | None = Field(default=None, gt=0, lt=2**31)
    beneficiaryAddress: _Address | None = None
    retiringAddress: _Address | None = None
    projectKey: _Text | None = None

    @field_validator("beneficiaryAddress", "retiringAddress")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return None if value is None else checksum_address(value)


class PricesQuery(Page):
    """Query of GET /prices: live seller listings, cheapest first."""

    chainId: int | None = Field(default=None, gt=0, lt=2**31)
    projectKey: _Text | None = None


_QUANTITY_RULE: Final = (
    "must be a decimal string (or a JSON number) of tonnes above 0 with at most 3 decimals"
)
POSITIVE_TONNES: Final = r"^([1-9][0-9]{0,11}(\.[0-9]{1,3})?|0\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9]))$"
"""Tonnes above 0 and below 10**12 with at most 3 decimals, as a decimal string."""


def _quantity(value: Any) -> str | int | Decimal:
    """A quantity's JSON type (string, integer or exact decimal number); its value is
    :func:`quantity_units`'s to judge (so every bad quantity is ``invalid_quantity``)."""
    if isinstance(value, str | int | Decimal) and not isinstance(value, bool):
        return value
    raise ValueError(_QUANTITY_RULE)


_Quantity = Annotated[
    str | int | Decimal,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": POSITIVE_TONNES},
                {"type": "integer", "minimum": 1, "maximum": 999_999_999_999},
            ],
            "description": "tonnes above 0 with at most 3 decimals (1 kg)",
        }
    ),
]


class QuoteRequest(_Strict):
    """Body of POST /quotes: exactly these two fields (spec: Endpoints). ``quantity_tonnes`` is
    a decimal (string or JSON number) with at most 3 decimals (1 kg), read by
    :func:`quantity_units` (any string reaches it, so every bad quantity is ``invalid_quantity``)."""

    asset_price_source_id: str = Field(max_length=200)
    quantity_tonnes: _Quantity


class ConsumptionMetadata(_Strict):
    """Required by whole-tonne registries (Puro): where and when the retired emissions arose.
    The same forms the retirement's ``details`` take (:mod:`relayer.domain.models`), so an
    order the edge accepts is one its retirement accepts (a month 13 is refused here, with
    400 naming the field, not later)."""

    consumptionCountryCode: CountryCode
    consumptionPeriodStart: IsoDate
    consumptionPeriodEnd: IsoDate


class OrderRequest(_Strict):
    """Body of POST /orders: a quote to fill, and the retirement's attribution."""

    quote_uuid: str = Field(
        pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )
    asset_price_source_id: str | None = Field(default=None, max_length=200)
    beneficiary_name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")
    retirement_message: str = Field(
        default="", max_length=500, pattern=r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
    )
    beneficiary_address: _Address | None = None
    consumption_metadata: ConsumptionMetadata | None = None

    @field_validator("beneficiary_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        """Checksummed; the zero address is never a beneficiary (as on the x402 surface)."""
        if value is None:
            return None
        checksummed = checksum_address(value)
        if checksummed == ZERO_ADDRESS:
            raise ValueError("the zero address is not allowed")
        return checksummed


def validated(model: type[_M], data: dict[str, Any]) -> _M:
    """``model`` from ``data``, or 400 ``schema_validation`` with one entry per field at fault
    (``fields``: the field's path and the rule it broke, as ``message`` says them, e.g.
    ``quantity_tonnes: must be ...``; values are never echoed).

    Raises:
        Rejection: 400 ``schema_validation``.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = [
            {"field": ".".join(str(p) for p in path) or "(body)", "problem": rule}
            for path, rule in field_problems(exc, data)
        ]
        raise bad_request(
            "schema_validation", "; ".join(f"{f['field']}: {f['problem']}" for f in fields), fields=fields
        ) from None


def quantity_units(value: str | Decimal | int) -> int:
    """``quantity_tonnes`` to credit units (kg) with the one tonne parser,
    :func:`relayer.domain.amounts.read_tonnes`. A string is read as it is; a JSON number as
    the exact decimal ``str`` writes it (an exponent it keeps, as in ``1E+3``, is refused).

    Returns:
        Credit units (1 to 10**15 - 1).

    Raises:
        Rejection: 400 ``invalid_quantity`` (malformed, zero, a fraction of a kg, or 10**12 t
            and above).
    """
    units = read_tonnes(value if isinstance(value, str) else str(value))
    if isinstance(units, TonnesFault):
        raise bad_request(
            "invalid_quantity",
            "quantity_tonnes must be a plain decimal (ASCII digits, no sign or exponent) above 0 "
            "and below 1000000000000, with at most 3 decimals (1 kg)",
        )
    return units


def price_units(text: str) -> int:
    """A USD (USDC) decimal with at most 3 decimals to USDC atomic units."""
    return int(Decimal(text) * 10**USDC_DECIMALS)


def usdc(atomic: int) -> str:
    """USDC atomic units as a decimal string ("12.5")."""
    return format_units(atomic, USDC_DECIMALS)


# ---------------------------------------------------------------------------- listings


@dataclass(frozen=True, slots=True)
class ListingEvent:
    """One decoded Marketplace event. ``data`` by kind: created {seller, creditToken, tokenId,
    amount, unitPrice, minFill, expiration}; updated {unitPrice, minFill, expiration}; filled
    {buyer, amount, cost}; cancelled {}. Numbers are ints."""

    listing_id: int
    kind: Literal["created", "updated", "filled", "cancelled"]
    data: dict[str, Any]
    block_number: int
    block_timestamp: int
    log_index: int = 0
    tx_hash: bytes = b""


@dataclass(frozen=True, slots=True)
class ListingInfo:
    """A marketplace listing's terms, as the contract holds them (read with ``listings(id)``)
    and as its events leave them: ``unit_price`` in USDC atomic units per tonne, amounts in
    credit units, ``expiration`` unix seconds."""

    listing_id: int
    seller: str
    credit_token: str
    token_id: int
    unit_price: int
    total_amount: int
    left_to_sell: int
    min_fill: int
    expiration: int
    active: bool

    def live(self, now: int) -> bool:
        """Offered: active, not sold out, not expired (spec: expired, cancelled and sold-out
        listings are not offered)."""
        return self.active and self.left_to_sell > 0 and self.expiration > now


@dataclass(frozen=True, slots=True)
class ListingState(ListingInfo):
    """A listing as its events leave it (the catalogue index): its terms and the block (and
    its time, unix seconds) of its creation and of its last change."""

    created_block: int
    created_at: int
    updated_block: int
    updated_at: int


def fold_listing(state: ListingState | None, event: ListingEvent) -> ListingState | None:
    """The listing after ``event`` (events in chain order). An event for a listing not created
    yet (the index started later) leaves it unknown (None)."""
    if event.kind == "created":
        d = event.data
        return ListingState(
            event.listing_id,
            str(d["seller"]),
            str(d["creditToken"]),
            int(d["tokenId"]),
            int(d["unitPrice"]),
            int(d["amount"]),
            int(d["amount"]),
            int(d["minFill"]),
            int(d["expiration"]),
            True,
            event.block_number,
            event.block_timestamp,
            event.block_number,
            event.block_timestamp,
        )
    if state is None:
        return None
    stamped = replace(state, updated_block=event.block_number, updated_at=event.block_timestamp)
    d = event.data
    if event.kind == "updated":
        return replace(
            stamped,
            unit_price=int(d["unitPrice"]),
            min_fill=int(d["minFill"]),
            expiration=int(d["expiration"]),
        )
    if event.kind == "filled":
        return replace(stamped, left_to_sell=max(0, state.left_to_sell - int(d["amount"])))
    return replace(stamped, active=False, left_to_sell=0)


# ---------------------------------------------------------------------------- provenance


@dataclass(frozen=True, slots=True)
class Transfer:
    """One indexed ERC-1155 movement of a credit (``amount`` in credit units). Position
    ``(block_number, log_index, batch_index)`` orders them."""

    block_number: int
    log_index: int
    batch_index: int
    tx_hash: bytes
    timestamp: int
    sender: str
    receiver: str
    amount: int

    @property
    def position(self) -> tuple[int, int, int]:
        return (self.block_number, self.log_index, self.batch_index)


@dataclass(frozen=True, slots=True)
class ProvenanceStep:
    """A provenance record: ``kind`` ORIGINATION (mint), TRANSFER or RETIREMENT (burn);
    ``remaining`` is the receiver's balance of the credit right after it (the holder's, for a
    retirement), in credit units."""

    kind: Literal["ORIGINATION", "TRANSFER", "RETIREMENT"]
    transfer: Transfer
    remaining: int


def provenance(transfers: Sequence[Transfer], retirement: Transfer) -> list[ProvenanceStep]:
    """Walk back from ``retirement`` (the burn) through ``transfers`` of the same credit (any
    order): the latest transfer into the holder before each step, until a mint, at most
    :data:`MAX_PROVENANCE_STEPS` steps. Oldest first. Balances are computed from the same
    transfers (a holder's in minus out up to that point)."""
    ordered = sorted(transfers, key=lambda t: t.position)

    def balance_after(holder: str, position: tuple[int, int, int]) -> int:
        total = 0
        for t in ordered:
            if t.position > position:
                break
            if t.receiver == holder:
                total += t.amount
            if t.sender == holder:
                total -= t.amount
        return total

    steps = [ProvenanceStep("RETIREMENT", retirement, balance_after(retirement.sender, retirement.position))]
    holder, before = retirement.sender, retirement.position
    for _ in range(MAX_PROVENANCE_STEPS):
        incoming = [t for t in ordered if t.receiver == holder and t.position < before and t.amount > 0]
        if not incoming:
            break
        step = incoming[-1]
        minted = step.sender == ZERO_ADDRESS
        steps.append(
            ProvenanceStep(
                "ORIGINATION" if minted else "TRANSFER", step, balance_after(holder, step.position)
            )
        )
        if minted:
            break
        holder, before = step.sender, step.position
    steps.reverse()
    return steps


@dataclass(frozen=True, slots=True)
class CreditRegistration:
    """A ``CreditRegistered`` event: the credit token id of a project's vintage on a chain."""

    token_id: int
    project_key: str
    vintage: int
    registry: str
    block_number: int
