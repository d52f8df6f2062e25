"""The x402 v2 wire: every payload the standard resource and facilitator read or write, as
typed models, and the typed values the payment code works with (spec: x402-foundation/x402
``specs/x402-specification-v2.md`` §5 (types) and ``specs/schemes/exact/scheme_exact_evm.md``;
the SDKs keep their wire models apart from their mechanisms the same way).

In: a ``PAYMENT-SIGNATURE`` header is decoded and validated once, by
:meth:`PaymentPayload.from_header`; a facilitator body once, by
``FacilitatorRequest.model_validate``. From there on the payment is that model: its
:meth:`~PaymentPayload.payment` is the typed :class:`Payment` the checks take, its
:meth:`~PaymentPayload.canonical` form is what the store keeps (JSONB), and the store reads it
back with ``PaymentPayload.model_validate`` (the same model, the same rules).

Out: ``PAYMENT-REQUIRED`` is a :class:`PaymentRequired`, ``PAYMENT-RESPONSE`` and the
facilitator's settle answer a :class:`SettleResponse`, each entry of ``accepts`` a
:class:`PaymentRequirements` made from a :class:`Requirements` (:meth:`PaymentRequirements.of`).

Amounts are atomic units of the asset, decimal strings on the wire and ``int`` in the typed
values; times are unix seconds. Models refuse unknown keys and coerce nothing (strict)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Final, Literal, Self

from eth_utils.crypto import keccak
from pydantic import AfterValidator, ConfigDict, Field, StringConstraints

from relayer.domain.addresses import checksum_address
from relayer.domain.models import StrictModel
from relayer.domain.verify import TransferAuthorization

X402_VERSION: Final = 2
SCHEME: Final = "exact"
PAYMENT_IDENTIFIER: Final = "payment-identifier"
"""The x402 extension whose ``info.id`` is a client's idempotency key (advertised in
``/supported``; spec: x402-foundation/x402 specs/extensions/payment_identifier.md)."""
ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
"""A payment identifier's format (the extension's spec, ``id`` Format)."""
MAX_HEADER_CHARS: Final = 16 * 1024
"""The longest x402 header read (characters of base64)."""


# ---------------------------------------------------------------------- typed values


@dataclass(frozen=True, slots=True)
class Requirements:
    """x402 ``PaymentRequirements`` (or the payload's echoed ``accepted``), typed: addresses
    as given (compared case-insensitively), ``amount`` in atomic units, ``max_timeout_s`` in
    seconds."""

    scheme: str
    network: str
    asset: str
    amount: int
    pay_to: str
    max_timeout_s: int
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PaymentIdentifier:
    """A ``payment-identifier`` extension's ``info.id`` (16-128 of ``[A-Za-z0-9_-]``) and the
    SHA-256 (32 bytes) of the canonical JSON of the ``paymentPayload`` that carried it."""

    id: str
    payload_hash: bytes


@dataclass(frozen=True, slots=True)
class Payment:
    """One payment to check: the requirements the resource server asks for, the ``accepted``
    entry the client echoed, the client's signed authorization, and its payment identifier if
    it gave one."""

    requirements: Requirements
    accepted: Requirements
    authorization: TransferAuthorization
    identifier: PaymentIdentifier | None = None


# ---------------------------------------------------------------------- wire models


def _uint256(text: str) -> str:
    if int(text) >= 1 << 256:
        raise ValueError("must be below 2**256")
    return text


Address = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
Uint = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,78}$"), AfterValidator(_uint256)]
Bytes32 = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{64}$")]
Signature = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{130}$")]
Text = Annotated[str, StringConstraints(max_length=200)]


class WireModel(StrictModel):
    """Unknown keys refused (:class:`StrictModel`), and no type coercion (an amount is a
    decimal string, ``maxTimeoutSeconds`` an integer)."""

    model_config = ConfigDict(strict=True)

    def canonical(self) -> dict[str, Any]:
        """The wire form: JSON types, wire names, absent fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def header(self) -> str:
        """The wire form as an x402 header (:func:`encode_header`)."""
        return encode_header(self.canonical())


class Authorization(WireModel):
    """EIP-3009 ``TransferWithAuthorization`` fields as the exact EVM scheme sends them
    (value in atomic units, validity bounds in unix seconds, the payer's 32-byte nonce)."""

    from_: Address = Field(alias="from")
    to: Address
    value: Uint
    validAfter: Uint
    validBefore: Uint
    nonce: Bytes32


class ExactPayload(WireModel):
    """The ``exact`` EVM scheme's ``payload``: the authorization and its 65-byte signature."""

    authorization: Authorization
    signature: Signature


class PaymentRequirements(WireModel):
    """x402 ``PaymentRequirements`` (``extra`` free-form: the token's EIP-712 name and
    version, our ``quoteRef``)."""

    scheme: Text
    network: Text
    asset: Address
    amount: Uint
    payTo: Address
    maxTimeoutSeconds: int = Field(ge=0, le=10**9)
    extra: dict[str, Any] | None = None

    def typed(self) -> Requirements:
        return Requirements(
            self.scheme,
            self.network,
            self.asset,
            int(self.amount),
            self.payTo,
            self.maxTimeoutSeconds,
            self.extra or {},
        )

    @classmethod
    def of(cls, r: Requirements) -> Self:
        """The wire entry of ``r`` (``extra`` always present, possibly empty)."""
        return cls(
            scheme=r.scheme,
            network=r.network,
            asset=r.asset,
            amount=str(r.amount),
            payTo=r.pay_to,
            maxTimeoutSeconds=r.max_timeout_s,
            extra=dict(r.extra),
        )


class PaymentPayload(WireModel):
    """x402 ``PaymentPayload`` (``resource`` and ``extensions`` free-form): the
    ``PAYMENT-SIGNATURE`` header's content and the facilitator's ``paymentPayload``."""

    x402Version: Literal[2]
    payload: ExactPayload
    accepted: PaymentRequirements
    resource: dict[str, Any] | None = None
    extensions: dict[str, Any] | None = None

    @classmethod
    def from_header(cls, text: str) -> Self:
        """The payload a ``PAYMENT-SIGNATURE`` header carries.

        Raises:
            ValueError: not base64 of one JSON object (:func:`decode_header`), or not a
                valid payload (pydantic's ``ValidationError``, a ``ValueError``).
        """
        return cls.model_validate(decode_header(text))

    def authorization(self) -> TransferAuthorization:
        """The EIP-3009 authorization (addresses checksummed, amounts and times as integers,
        nonce and signature as bytes)."""
        a, signature = self.payload.authorization, self.payload.signature
        return TransferAuthorization(
            checksum_address(a.from_),
            checksum_address(a.to),
            int(a.value),
            int(a.validAfter),
            int(a.validBefore),
            bytes.fromhex(a.nonce[2:]),
            bytes.fromhex(signature[2:]),
        )

    def payment(self, requirements: Requirements | None = None) -> Payment:
        """The payment this payload makes against ``requirements`` (default: the payload's
        own ``accepted``, as the resource checks it against its quote)."""
        accepted = self.accepted.typed()
        return Payment(requirements or accepted, accepted, self.authorization())

    def digest(self) -> bytes:
        """Keccak-256 of the canonical form as compact JSON with sorted keys (32 bytes): the
        same payload whatever order its sender wrote."""
        return keccak(text=json.dumps(self.canonical(), sort_keys=True, separators=(",", ":")))


class FacilitatorRequest(WireModel):
    """The body of the facilitator's ``/verify`` and ``/settle``."""

    x402Version: Literal[2]
    paymentPayload: PaymentPayload
    paymentRequirements: PaymentRequirements

    def payment(self, identifier: PaymentIdentifier | None = None) -> Payment:
        p = self.paymentPayload.payment(self.paymentRequirements.typed())
        return replace(p, identifier=identifier)


class ResourceInfo(WireModel):
    """x402 ``ResourceInfo``: what a payment buys."""

    url: str
    description: str
    mimeType: str


class PaymentRequired(WireModel):
    """x402 ``PaymentRequired``: the ``PAYMENT-REQUIRED`` header of a 402 (``error``: why a
    payment was refused)."""

    x402Version: Literal[2]
    error: str | None = None
    resource: ResourceInfo
    accepts: list[PaymentRequirements]


class SettleResponse(WireModel):
    """x402 ``SettleResponse``: the ``PAYMENT-RESPONSE`` header and the facilitator's
    ``/settle`` answer (``transaction`` ``0x…`` or empty when nothing was sent; ``amount`` in
    atomic units when settled)."""

    success: bool
    errorReason: str | None = None
    errorMessage: str | None = None
    payer: str | None = None
    transaction: str
    network: str
    amount: Uint | None = None


# ---------------------------------------------------------------------- headers and ids


def encode_header(value: Mapping[str, Any]) -> str:
    """Standard base64 (padded) of compact JSON, as both SDKs write the x402 headers."""
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()


def decode_header(text: str) -> dict[str, Any]:
    """The JSON object of an x402 header.

    Raises:
        ValueError: not base64 of one JSON object, or longer than :data:`MAX_HEADER_CHARS`.
    """
    if len(text) > MAX_HEADER_CHARS:
        raise ValueError("header too long")
    try:
        value = json.loads(base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not base64 JSON: {type(exc).__name__}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def payment_identifier(body: Mapping[str, Any]) -> PaymentIdentifier | None:
    """The ``payment-identifier`` extension of a validated facilitator body's
    ``paymentPayload``: its ``info.id`` and the SHA-256 of the payload's canonical JSON (keys
    sorted, compact, UTF-8, of the body as sent: the same payload hashes the same whichever
    SDK ordered its keys). None when the extension or its id is absent (the server's
    declaration echoed back carries no id).

    Raises:
        ValueError: the extension is malformed (``info`` not an object, ``required`` not a
            boolean) or its ``id`` is not 16-128 of ``[A-Za-z0-9_-]`` (the spec's format).
    """
    extensions = body["paymentPayload"].get("extensions") or {}
    extension = extensions.get(PAYMENT_IDENTIFIER)
    if extension is None:
        return None
    info = extension.get("info") if isinstance(extension, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("required", False), bool):
        raise ValueError(f"extensions.{PAYMENT_IDENTIFIER}.info must be an object with a boolean 'required'")
    pid = info.get("id")
    if pid is None:
        return None
    if not isinstance(pid, str) or ID_PATTERN.fullmatch(pid) is None:
        raise ValueError(f"extensions.{PAYMENT_IDENTIFIER}.info.id must be 16-128 of A-Z a-z 0-9 _ -")
    try:
        canonical = json.dumps(
            body["paymentPayload"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    except (RecursionError, ValueError):  # nested as deep as the parser allowed
        raise ValueError("paymentPayload is nested too deeply") from None
    return PaymentIdentifier(pid, hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest())
