"""Strict request models of the x402 retirement endpoint and their error mapping.

Unknown keys at the top level or inside ``details``/``authPayload`` are errors
(``schema_validation`` with ``issues[].path`` and ``issues[].keys``). Numbers that carry
money are decimal strings of atomic units; ``amount`` is a decimal tonne string. Every
integer is bounded by its wire type (uint256 on-chain, INTEGER in SQL); addresses are
EIP-55-valid and non-zero.
Spec: x402-retirement-endpoint.md, Resources and Rules.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from relayer.domain.addresses import checksum_address
from relayer.domain.errors import Rejection
from relayer.domain.marketplace import ADDRESS_SCHEMA, POSITIVE_TONNES, SOURCE_ID
from relayer.domain.models import CountryCode, IsoDate, StrictModel, field_problems

ACTIONS: Final = ("discover", "quote", "prepare/retire", "prepare-auth", "actions/retire", "certificate")
_CHOICE: Final = ("carbonClass", "listingId", "credit", "creditToken", "tokenId", "vintage")
_PREPARE: Final = ("chainId", "inputToken", "amount", *_CHOICE, "from", "details")
ACTION_FIELDS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "discover": (
            "chainId",
            "source",
            "carbonClass",
            "listingId",
            "tokenId",
            "vintage",
            "project",
            "country",
            "category",
            "methodology",
            "maxUsdcPricePerTonne",
        ),
        "quote": ("chainId", "inputToken", "amount", *_CHOICE),
        "prepare/retire": _PREPARE,
        "prepare-auth": _PREPARE,
        "actions/retire": (*_PREPARE, "salt", "gasAllowance", "authPayload"),
        "certificate": ("chainId", "txHash", "index"),
    }
)
"""The fields of :class:`ActionRequest` each action reads (others are accepted and ignored):
the per-action request schemas of the OpenAPI document and the manifest."""
ACTION_REQUIRED: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "discover": (),
        "quote": ("amount",),
        "prepare/retire": ("amount", "from"),
        "prepare-auth": ("amount", "from"),
        "actions/retire": ("amount", "from", "authPayload"),
        "certificate": ("txHash",),
    }
)
"""The fields each action refuses to go without (``schema_validation`` naming them;
actions/retire without ``authPayload`` answers 402 ``payment_required``)."""
CHOOSES_CREDIT: Final = frozenset({"quote", "prepare/retire", "prepare-auth", "actions/retire"})
"""Actions that take exactly one of ``carbonClass`` and ``listingId`` (or ``credit`` alone)."""
NAMES_BENEFICIARY: Final = frozenset({"prepare-auth", "actions/retire"})
"""Actions whose ``details`` must name the beneficiary on major 1 (``attribution_required``)."""


UINT256_MAX: Final = 2**256 - 1
INT32_MAX: Final = 2**31 - 1
_ZERO_ADDRESS: Final = "0x" + "0" * 40


def _address(value: str) -> str:
    """EIP-55: a mixed-case address must carry a valid checksum (a typo is caught); an
    all-lower- or all-upper-case one carries none and is accepted, as viem and ethers do.
    The zero address is never a valid party. Returns the checksummed form."""
    checksummed = checksum_address(value)
    body = value[2:]
    if body != body.lower() and body != body.upper() and value != checksummed:
        raise ValueError("bad EIP-55 checksum")
    if checksummed == _ZERO_ADDRESS:
        raise ValueError("the zero address is not allowed")
    return checksummed


Address = Annotated[
    str,
    StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$"),
    AfterValidator(_address),
    WithJsonSchema(ADDRESS_SCHEMA),
]
Bytes32 = Annotated[
    str,
    StringConstraints(min_length=66, max_length=66, pattern=r"^0x[0-9a-fA-F]{64}$"),
    AfterValidator(str.lower),
]


def _uint256(value: str) -> str:
    if int(value) > UINT256_MAX:
        raise ValueError("must be below 2**256")
    return value


def _symbol_or_address(value: str) -> str:
    """A token symbol, or an address under the same EIP-55 rule as every other address."""
    return _address(value) if value[:2].lower() == "0x" and len(value) == 42 else value


Atomic = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,77})$"), AfterValidator(_uint256)]


def _not_bool(value: Any) -> Any:
    """JSON ``true``/``false`` are not numbers (Python would take them as 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


Uint256 = Annotated[int, Field(ge=0, le=UINT256_MAX), BeforeValidator(_not_bool)]
_BYTES32_HEX: Final = re.compile(r"0x[0-9a-fA-F]{64}")


_DECIMAL: Final = re.compile(r"[0-9]+")


def _bytes32_as_int(value: Any) -> Any:
    """A listing id written as the marketplace API writes it (``0x`` and 64 hex digits, the id
    as bytes32, or its price source id ``listing-<chainId>-0x<64 hex>``) becomes that
    integer; a decimal string or a number is left to the int rules.

    Raises:
        Rejection: ``listing_not_found`` for a string of any other shape: it names no listing
            (spec: an identifier that names nothing is not a schema error).
    """
    if not isinstance(value, str) or not value or _DECIMAL.fullmatch(value):
        return _not_bool(value)
    if _BYTES32_HEX.fullmatch(value):
        return int(value, 16)
    source = SOURCE_ID.fullmatch(value)
    if source is not None:
        return int(source[2], 16)
    raise Rejection("listing_not_found", listingId=value[:200])


ListingId = Annotated[
    int,
    Field(ge=0, le=UINT256_MAX),
    BeforeValidator(
        _bytes32_as_int,
        json_schema_input_type=Annotated[int, Field(ge=0, le=UINT256_MAX)]
        | Annotated[str, StringConstraints(min_length=1, max_length=200)],
    ),
]
"""A listing id: a decimal uint256, the same number as bytes32 hex (``0x`` + 64 digits) or
as the marketplace's price source id; any other string names no listing."""
Signature = Annotated[str, StringConstraints(min_length=132, max_length=132, pattern=r"^0x[0-9a-fA-F]{130}$")]
ShortText = Annotated[str, StringConstraints(max_length=200)]
LongText = Annotated[str, StringConstraints(max_length=1000)]
UsdcDecimal = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,11})(\.[0-9]{1,6})?$")]


class _Strict(StrictModel):
    model_config = ConfigDict(populate_by_name=False)

    @field_validator("*", mode="after")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        """Every string must be storable and hashable: no NUL (Postgres text and JSONB
        cannot hold it) and no lone surrogate (it has no UTF-8 form to hash or encode)."""
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError("NUL characters are not allowed")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("lone surrogates are not allowed") from None
        return value


class Details(_Strict):
    """Attribution and consumption metadata (spec: `details`)."""

    retiringAddress: Address | None = None
    beneficiaryAddress: Address | None = None
    beneficiaryIsPayer: bool | None = None
    beneficiaryString: ShortText = ""
    retiringEntityString: ShortText = ""
    retirementMessage: LongText = ""
    beneficiaryLocation: ShortText = ""
    consumptionCountryCode: CountryCode | None = None
    consumptionPeriodStart: IsoDate | None = None
    consumptionPeriodEnd: IsoDate | None = None


class AuthPayload(_Strict):
    """A signed authorization: EIP-3009 (USDC, ``nonce`` bytes32 hex) or EIP-2612 permit
    (kVCM, ``nonce`` the token's permit nonce as a decimal string, ``validBefore`` the
    deadline). Signature as ``signature`` (65 bytes hex) or ``v``/``r``/``s``."""

    from_: Address = Field(alias="from")
    to: Address
    value: Atomic
    validAfter: Atomic = "0"
    validBefore: Atomic
    # its form depends on the scheme (bytes32 hex or decimal uint256): the verifier checks it
    nonce: str = Field(max_length=80)
    signature: Signature | None = None
    v: StrictInt | None = Field(default=None, ge=0, le=28)
    r: Bytes32 | None = None
    s: Bytes32 | None = None

    def signature_bytes(self) -> bytes | None:
        """65-byte r||s||v, or None when no signature was given."""
        if self.signature is not None:
            return bytes.fromhex(self.signature[2:])
        if self.v is not None and self.r is not None and self.s is not None:
            return bytes.fromhex(self.r[2:]) + bytes.fromhex(self.s[2:]) + bytes([self.v])
        return None


class ActionRequest(_Strict):
    """Every field an action may take; which are required depends on the action."""

    action: str | None = None
    chainId: Uint256 | None = None
    inputToken: Annotated[str, AfterValidator(_symbol_or_address)] | None = Field(default=None, max_length=64)
    # read by parse_tonnes (its own refusals): the schema says the rule it applies
    amount: Annotated[str, WithJsonSchema({"type": "string", "pattern": POSITIVE_TONNES})] | None = Field(
        default=None, max_length=40
    )
    carbonClass: str | None = Field(default=None, max_length=64)
    creditToken: Address | None = None
    tokenId: Uint256 | None = None
    credit: str | None = Field(default=None, max_length=80)
    vintage: int | None = Field(default=None, ge=1900, le=2200)
    listingId: ListingId | None = None
    from_: Address | None = Field(default=None, alias="from")
    txHash: Bytes32 | None = None
    # a retirement's index within its transaction (stored as a Postgres INTEGER)
    index: Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_not_bool)] | None = None
    salt: Bytes32 | None = None
    gasAllowance: Atomic | None = None
    authPayload: AuthPayload | None = None
    details: Details | None = None
    # discover filters
    source: (
        Literal["carbonClass", "carbonClasses", "listing", "marketplace", "marketplaceListings"] | None
    ) = None
    project: str | None = Field(default=None, max_length=80)
    country: str | None = Field(default=None, max_length=80)
    category: str | None = Field(default=None, max_length=80)
    methodology: str | None = Field(default=None, max_length=80)
    maxUsdcPricePerTonne: UsdcDecimal | None = None


def nest_query(query: dict[str, str]) -> dict[str, Any]:
    """Turn GET query parameters into the POST body shape: ``details.x=1`` -> ``{details: {x: 1}}``.

    Raises:
        Rejection: ``schema_validation`` on a key nested deeper than one level.
    """
    out: dict[str, Any] = {}
    for key, value in query.items():
        head, dot, tail = key.partition(".")
        if not dot:
            out[key] = value
            continue
        if "." in tail or not isinstance(out.setdefault(head, {}), dict):
            raise Rejection(
                "schema_validation", issues=[{"path": [head], "keys": [key], "message": "bad key"}]
            )
        out[head][tail] = value
    return out


def parse_request(body: dict[str, Any]) -> ActionRequest:
    """Validate a request body strictly.

    Raises:
        Rejection: ``schema_validation`` with ``issues[]`` of ``{path, keys, message}``;
            unrecognized keys are grouped per object in ``keys``.
    """
    try:
        return ActionRequest.model_validate(body)
    except ValidationError as exc:
        raise Rejection("schema_validation", issues=validation_issues(exc, body)) from None


def validation_issues(exc: ValidationError, data: Any) -> list[dict[str, Any]]:
    """pydantic errors (of validating ``data``) as the spec's ``issues[]``: unknown keys
    grouped under their parent ``path`` in ``keys``; every other field at fault one issue
    with an empty ``keys``, its ``message`` the rule it broke (see
    :func:`~relayer.domain.models.field_problems`: no pydantic internals)."""
    unknown: dict[tuple[str | int, ...], list[str]] = defaultdict(list)
    issues: list[dict[str, Any]] = []
    for path, rule in field_problems(exc, data):
        if rule == "unrecognized key":
            unknown[path[:-1]].append(str(path[-1]))
        else:
            issues.append({"path": list(path), "keys": [], "message": rule})
    for path, keys in unknown.items():
        issues.insert(0, {"path": list(path), "keys": sorted(keys), "message": "unrecognized keys"})
    return issues


def require(request: ActionRequest, *names: str) -> None:
    """Raise ``schema_validation`` naming every missing required field."""
    missing = [n for n in names if getattr(request, "from_" if n == "from" else n) is None]
    if missing:
        raise Rejection(
            "schema_validation",
            f"missing required field(s): {', '.join(missing)}",
            issues=[{"path": [n], "keys": [], "message": "required"} for n in missing],
        )
