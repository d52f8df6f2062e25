"""The pure verifier of a relayed retirement's signed authorization (spec: Authentication;
Errors, authorization group). No I/O and no clock: the caller passes the terms it resolved
from live state and ``now``; the answer is the verified authorization or a refusal.

Checks run cheapest first: presence and shape (from/to, salt, gas allowance, nonce form,
canonical signature; :func:`check_shape`, which needs no terms, so the service runs it before
any I/O), validity window, nonce binding (two keccaks of the retirement), the signer recovery
(an elliptic-curve operation), and last the value against total + gas allowance: a cheap
check, but an economic one, so that a forged or foreign signature is refused as such and
never told to re-sign for more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from eth_abi.abi import encode
from eth_utils.crypto import keccak

from relayer.domain import eip712
from relayer.domain.errors import Rejection
from relayer.domain.retirement import Retirement, bind_nonce, permit_binds, permit_expiry
from relayer.domain.schemas import ActionRequest

Scheme = Literal["eip3009", "eip2612"]

AUTH_EXPIRY_MARGIN_S: Final = 30
"""An authorization that expires within this many seconds is refused: it could not be mined."""
BIGINT_MAX: Final = 2**63 - 1
"""Expiries are stored as Postgres BIGINT; a later one (up to uint256) never expires in practice."""
UINT256_MAX: Final = 2**256 - 1
_BYTES32_NONCE: Final = re.compile(r"0x[0-9a-fA-F]{64}")
_PERMIT_NONCE: Final = re.compile(r"0|[1-9][0-9]{0,77}")  # ASCII digits only: "²".isdigit() is True


@dataclass(frozen=True, slots=True)
class Terms:
    """What the daemon resolved for a request from live state.

    Attributes:
        chain_id: the chain served (8453 or 84532).
        settlement: checksummed settlement contract, the only valid ``authPayload.to``.
        scheme: ``eip3009`` (USDC ReceiveWithAuthorization) or ``eip2612`` (kVCM Permit).
        input_token: checksummed address of the token paid with (the EIP-712 verifying
            contract).
        retirement: the retirement the payer must have signed, with the gas allowance the
            request carries (0 when it carries none).
        total: quote total (retirement cost + protocol fee), input-token atomic units.
        summary: what was submitted, echoed as ``submitted`` in ``params_mismatch``.
    """

    chain_id: int
    settlement: str
    scheme: Scheme
    input_token: str
    retirement: Retirement
    total: int
    summary: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class VerifiedAuthorization:
    """A signed authorization that passed every check. Amounts in input-token atomic units,
    times in unix seconds.

    Attributes:
        valid_before: as signed: the EIP-3009 ``validBefore`` or the EIP-2612 ``deadline``
            (which carries the bound nonce's high 192 bits).
        expires_at: when the authorization stops being valid, capped at :data:`BIGINT_MAX`.
        bound_nonce: ``keccak256(abi.encode(hashRetirement(r), salt))``; the EIP-3009
            nonce, and the job's authorization key.
        permit_nonce: the kVCM permit nonce (EIP-2612 only).
        permit_key: :func:`permit_key` of the permit (EIP-2612 only): one live job per key.
        request_hash: :func:`request_hash` of the request (the identical-request check).
    """

    scheme: Scheme
    payer: str
    value: int
    valid_after: int
    valid_before: int
    expires_at: int
    bound_nonce: bytes
    permit_nonce: int | None
    permit_key: bytes | None
    salt: bytes
    gas_allowance: int
    signature: eip712.Signature
    request_hash: bytes
    retirement: Retirement


@dataclass(frozen=True, slots=True)
class SignedAuthorization:
    """An authorization as its payer signed it, typed: what every path into the relay hands
    to :func:`verify_signed`. Amounts in input-token atomic units, times in unix seconds.

    Attributes:
        payer: checksummed ``from`` (EIP-3009) or ``owner`` (EIP-2612).
        value: the signed value (retirement total, fee and gas allowance).
        valid_after: EIP-3009 ``validAfter`` (0 for a permit).
        valid_before: EIP-3009 ``validBefore``, or the EIP-2612 ``deadline`` (which carries
            the bound nonce's high 192 bits).
        nonce: the EIP-3009 32-byte bound nonce, or the EIP-2612 permit nonce.
        salt: the 32-byte salt bound into the nonce with the retirement.
        gas_allowance: the gas allowance the retirement carries.
        signature: the canonical (low-s) signature.
    """

    payer: str
    value: int
    valid_after: int
    valid_before: int
    nonce: bytes | int
    salt: bytes
    gas_allowance: int
    signature: eip712.Signature


def request_hash(request: ActionRequest) -> bytes:
    """keccak256 of the request's canonical JSON (sorted keys, wire names): equal exactly
    when two requests are identical field for field."""
    return keccak(text=json.dumps(request.model_dump(mode="json", by_alias=True), sort_keys=True))


def permit_key(token: str, owner: str, nonce: int) -> bytes:
    """keccak256(abi.encode(token, owner, nonce)): names one EIP-2612 permit nonce."""
    return keccak(encode(["address", "address", "uint256"], [token, owner, nonce]))


def typed_data(
    terms: Terms, payer: str, value: int, valid_after: int, valid_before: int, nonce: bytes | int
) -> dict[str, Any]:
    """The EIP-712 typed data the payer signs for ``terms``: an EIP-3009
    ReceiveWithAuthorization (``nonce`` the 32-byte bound nonce) or an EIP-2612 Permit
    (``nonce`` the permit nonce, ``valid_before`` the bound deadline)."""
    if terms.scheme == "eip3009":
        assert isinstance(nonce, bytes)
        return eip712.receive_with_authorization(
            chain_id=terms.chain_id,
            usdc=terms.input_token,
            payer=payer,
            settlement=terms.settlement,
            value=value,
            valid_after=valid_after,
            valid_before=valid_before,
            nonce=nonce,
        )
    assert isinstance(nonce, int)
    return eip712.permit(
        chain_id=terms.chain_id,
        kvcm=terms.input_token,
        owner=payer,
        spender=terms.settlement,
        value=value,
        nonce=nonce,
        deadline=valid_before,
    )


def verify_authorization(request: ActionRequest, terms: Terms, now: int) -> VerifiedAuthorization | Rejection:
    """Verify a parsed ``actions/retire`` request against the resolved terms at ``now``:
    :func:`check_shape`, then :func:`verify_signed`.

    Args:
        request: the strictly parsed request (its ``authPayload`` may still be absent).
        terms: what the daemon resolved for it from live state.
        now: unix seconds.

    Returns:
        The verified authorization, or the refusal (never raised) with its spec code:
        ``invalid_auth_payload`` (missing authorization, salt or gas allowance; from/to
        mismatch; nonce malformed or of the wrong scheme; non-canonical or foreign
        signature; expired or about to expire), ``params_mismatch`` (the nonce or permit
        deadline does not bind this retirement and salt; ``expectedNonce``,
        ``receivedNonce``, ``submitted``), ``insufficient_authorized_value``
        (``requiredMinimum``), ``schema_validation`` (no ``from``).
    """
    shaped = check_shape(request, terms.settlement, terms.scheme)
    if isinstance(shaped, Rejection):
        return shaped
    return verify_signed(shaped, terms, now, request_hash(request))


def verify_signed(
    auth: SignedAuthorization, terms: Terms, now: int, request_key: bytes
) -> VerifiedAuthorization | Rejection:
    """Verify a well-shaped signed authorization against the resolved terms at ``now``: the
    typed entry of every path into the relay (an ``actions/retire`` request after
    :func:`check_shape`, a marketplace order signed by the treasury).

    Args:
        auth: the authorization as signed (amounts in input-token atomic units).
        terms: what the daemon resolved from live state.
        now: unix seconds.
        request_key: 32 bytes naming the request for the identical-request check
            (:func:`request_hash` of an ``actions/retire`` body).

    Returns:
        The verified authorization, or the refusal (never raised): ``invalid_auth_payload``
        (expired or about to expire, foreign signature), ``params_mismatch`` (the nonce or
        permit deadline does not bind this retirement and salt),
        ``insufficient_authorized_value``.
    """
    retirement = replace(terms.retirement, gas_allowance=auth.gas_allowance)
    usdc = terms.scheme == "eip3009"
    if usdc != isinstance(auth.nonce, bytes):
        return Rejection("invalid_auth_payload", f"the nonce is not of the {terms.scheme} scheme's form")
    expires_at = min(auth.valid_before if usdc else permit_expiry(auth.valid_before), BIGINT_MAX)
    if expires_at <= now + AUTH_EXPIRY_MARGIN_S:
        return Rejection(
            "invalid_auth_payload", "authorization expired or about to expire", validBefore=str(expires_at)
        )
    bound = bind_nonce(retirement, auth.salt)
    unbound = _check_binding(auth, bound, usdc, terms.summary)
    if unbound is not None:
        return unbound
    typed = typed_data(terms, auth.payer, auth.value, auth.valid_after, auth.valid_before, auth.nonce)
    try:
        signer = eip712.recover_signer(typed, auth.signature)
    except ValueError:
        return Rejection("invalid_auth_payload", "signature does not recover")
    if signer != auth.payer:
        return Rejection("invalid_auth_payload", "signature is not from `from`")
    required = terms.total + auth.gas_allowance
    if auth.value < required:
        return Rejection(
            "insufficient_authorized_value", requiredMinimum=str(required), authorized=str(auth.value)
        )
    permit_nonce = auth.nonce if isinstance(auth.nonce, int) else None
    return VerifiedAuthorization(
        scheme=terms.scheme,
        payer=auth.payer,
        value=auth.value,
        valid_after=auth.valid_after,
        valid_before=auth.valid_before,
        expires_at=expires_at,
        bound_nonce=bound,
        permit_nonce=permit_nonce,
        permit_key=None if permit_nonce is None else permit_key(terms.input_token, auth.payer, permit_nonce),
        salt=auth.salt,
        gas_allowance=auth.gas_allowance,
        signature=auth.signature,
        request_hash=request_key,
        retirement=retirement,
    )


def check_shape(request: ActionRequest, settlement: str, scheme: Scheme) -> SignedAuthorization | Rejection:
    """The checks that need no terms: an authorization is present, from and to match, the
    salt and gas allowance are there, the nonce has its scheme's form, and the signature is
    canonical. Returns the typed :class:`SignedAuthorization` or the refusal
    (``invalid_auth_payload``, or ``schema_validation`` without ``from``)."""
    auth = request.authPayload
    if auth is None:
        return Rejection("invalid_auth_payload", "actions/retire needs a signed authPayload")
    if request.from_ is None:
        return Rejection(
            "schema_validation",
            "missing required field(s): from",
            issues=[{"path": ["from"], "keys": [], "message": "required"}],
        )
    if auth.from_ != request.from_:
        return Rejection("invalid_auth_payload", "authPayload.from must equal from")
    if auth.to != settlement:
        return Rejection(
            "invalid_auth_payload", "authPayload.to must be the settlement contract", expectedTo=settlement
        )
    if request.salt is None:
        return Rejection("invalid_auth_payload", "a relayed retirement needs the top-level salt")
    if request.gasAllowance is None:
        return Rejection("invalid_auth_payload", "gasAllowance from prepare-auth is missing")
    if scheme == "eip3009" and not _BYTES32_NONCE.fullmatch(auth.nonce):
        return Rejection(
            "invalid_auth_payload", "USDC needs an EIP-3009 bytes32 nonce (0x and 64 hex digits)"
        )
    if scheme == "eip2612" and not (_PERMIT_NONCE.fullmatch(auth.nonce) and int(auth.nonce) <= UINT256_MAX):
        return Rejection("invalid_auth_payload", "kVCM needs an EIP-2612 permit nonce (a decimal uint256)")
    raw = auth.signature_bytes()
    if raw is None:
        return Rejection("invalid_auth_payload", "authPayload needs signature or v/r/s")
    try:
        signature = eip712.parse_signature(raw)
    except ValueError as exc:
        return Rejection("invalid_auth_payload", f"signature is not canonical: {exc}")
    return SignedAuthorization(
        payer=request.from_,
        value=int(auth.value),
        valid_after=int(auth.validAfter),
        valid_before=int(auth.validBefore),
        nonce=bytes.fromhex(auth.nonce[2:]) if scheme == "eip3009" else int(auth.nonce),
        salt=bytes.fromhex(request.salt[2:]),
        gas_allowance=int(request.gasAllowance),
        signature=signature,
    )


def _check_binding(
    auth: SignedAuthorization, bound: bytes, usdc: bool, summary: Mapping[str, Any]
) -> Rejection | None:
    """The signed nonce (USDC) or permit deadline (kVCM) must carry this retirement's bound
    nonce; otherwise the submitted retirement differs from the authorized one."""
    expected = "0x" + bound.hex()
    if usdc:
        if auth.nonce == bound:
            return None
        received = auth.nonce.hex() if isinstance(auth.nonce, bytes) else f"{auth.nonce:064x}"
        return Rejection(
            "params_mismatch",
            expectedNonce=expected,
            receivedNonce="0x" + received,
            submitted=dict(summary),
        )
    if permit_binds(auth.valid_before, bound):
        return None
    return Rejection(
        "params_mismatch",
        "the permit deadline does not carry this retirement's nonce",
        expectedNonce=expected,
        receivedNonce=f"0x{auth.valid_before >> 64:048x}",
        submitted=dict(summary),
    )


# -- EIP-3009 transfers (the ``transfer`` job kind) -------------------------------------

TRANSFER_SALT_DOMAIN: Final = b"relayer/x402-transfer/v1"
"""Prefix of a transfer job's salt: ``keccak256(TRANSFER_SALT_DOMAIN || bound_nonce)``."""

TransferReason = Literal[
    "invalid_payment_requirements",
    "invalid_exact_evm_payload_recipient_mismatch",
    "invalid_exact_evm_payload_authorization_value_mismatch",
    "invalid_exact_evm_payload_authorization_valid_before",
    "invalid_exact_evm_payload_authorization_valid_after",
    "invalid_exact_evm_payload_signature",
]
"""Why :func:`verify_transfer` refuses: the x402 v2 spec's reason names."""


@dataclass(frozen=True, slots=True)
class TokenDomain:
    """The EIP-712 domain of the EIP-3009 token served: chain, checksummed address, name and
    version (USDC: ``USD Coin``/``USDC`` and ``2``)."""

    chain_id: int
    address: str
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class TransferRequirement:
    """What a transfer must pay: ``amount`` atomic units of ``asset`` (checksummed token
    address) to ``pay_to`` (checksummed), exactly."""

    asset: str
    pay_to: str
    amount: int


@dataclass(frozen=True, slots=True)
class TransferAuthorization:
    """An EIP-3009 TransferWithAuthorization as its payer signed it: addresses checksummed,
    ``value`` in atomic units, validity bounds in unix seconds, ``nonce`` 32 bytes the payer
    chose, ``signature`` the raw 65 bytes r||s||v."""

    payer: str
    to: str
    value: int
    valid_after: int
    valid_before: int
    nonce: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class VerifiedTransfer:
    """A transfer authorization that passed every pure check: what ``Relay.accept_transfer``
    takes. ``bound_nonce`` = :func:`transfer_bound_nonce` (the job's identity), ``salt`` =
    :func:`transfer_salt`, ``expires_at`` the ``validBefore`` capped at :data:`BIGINT_MAX`,
    ``request_hash`` names the request (same authorization and request: the same job)."""

    chain_id: int
    token: str
    payer: str
    to: str
    value: int
    valid_after: int
    valid_before: int
    expires_at: int
    nonce: bytes
    signature: eip712.Signature
    bound_nonce: bytes
    salt: bytes
    request_hash: bytes


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refusal returned as a value, the one shape of every payment surface (the facilitator's
    verify and settle, the x402 resource): ``reason`` an x402 reason name (for an EIP-3009
    authorization, a :data:`TransferReason`) and a sentence for people."""

    reason: str
    message: str


def transfer_bound_nonce(token: str, payer: str, nonce: bytes) -> bytes:
    """``keccak256(abi.encode(token, from, nonce))``: one EIP-3009 authorization's identity
    (the token's own single-use key is (from, nonce)); a transfer job's ``bound_nonce``."""
    return keccak(encode(["address", "address", "bytes32"], [token, payer, nonce]))


def transfer_salt(bound_nonce: bytes) -> bytes:
    """``keccak256("relayer/x402-transfer/v1" || bound_nonce)``: a transfer job's salt."""
    return keccak(TRANSFER_SALT_DOMAIN + bound_nonce)


def transfer_request_hash(auth: TransferAuthorization, requirement: TransferRequirement) -> bytes:
    """keccak256 of the canonical JSON of the authorization, its signature and the requirement's
    core (asset, payTo, amount): the default request key of a transfer."""
    return keccak(
        text=json.dumps(
            {
                "from": auth.payer,
                "to": auth.to,
                "value": str(auth.value),
                "validAfter": str(auth.valid_after),
                "validBefore": str(auth.valid_before),
                "nonce": "0x" + auth.nonce.hex(),
                "signature": "0x" + auth.signature.hex(),
                "asset": requirement.asset,
                "payTo": requirement.pay_to,
                "amount": str(requirement.amount),
            },
            sort_keys=True,
        )
    )


def verify_transfer(
    auth: TransferAuthorization,
    requirement: TransferRequirement,
    domain: TokenDomain,
    now: int,
    *,
    margin_s: int = AUTH_EXPIRY_MARGIN_S,
    request_key: bytes | None = None,
) -> VerifiedTransfer | Refusal:
    """Verify an EIP-3009 TransferWithAuthorization against what it must pay, at ``now``
    (unix seconds), cheapest first: the requirement names the token served, the recipient,
    the exact value, the validity window (``validBefore`` more than ``margin_s`` seconds
    ahead, ``validAfter`` reached), then the canonical (low-s) signature recovers to ``from``.
    Pure: no I/O, no clock.

    Args:
        request_key: 32 bytes naming the request (default :func:`transfer_request_hash`).

    Returns:
        The :class:`VerifiedTransfer`, or the :class:`Refusal` (never raised).
    """
    if requirement.asset.lower() != domain.address.lower():
        return Refusal("invalid_payment_requirements", "the asset is not the token served")
    if auth.to.lower() != requirement.pay_to.lower():
        return Refusal("invalid_exact_evm_payload_recipient_mismatch", "authorization.to is not payTo")
    if auth.value != requirement.amount:
        return Refusal(
            "invalid_exact_evm_payload_authorization_value_mismatch",
            f"authorization.value must be exactly {requirement.amount}",
        )
    if auth.valid_before <= now + margin_s:
        return Refusal(
            "invalid_exact_evm_payload_authorization_valid_before", "authorization expired or about to expire"
        )
    if auth.valid_after > now:
        return Refusal("invalid_exact_evm_payload_authorization_valid_after", "authorization not yet valid")
    signature = _transfer_signer_checked(auth, domain)
    if isinstance(signature, Refusal):
        return signature
    bound = transfer_bound_nonce(domain.address, auth.payer, auth.nonce)
    return VerifiedTransfer(
        chain_id=domain.chain_id,
        token=domain.address,
        payer=auth.payer,
        to=auth.to,
        value=auth.value,
        valid_after=auth.valid_after,
        valid_before=auth.valid_before,
        expires_at=min(auth.valid_before, BIGINT_MAX),
        nonce=auth.nonce,
        signature=signature,
        bound_nonce=bound,
        salt=transfer_salt(bound),
        request_hash=request_key if request_key is not None else transfer_request_hash(auth, requirement),
    )


def _transfer_signer_checked(auth: TransferAuthorization, domain: TokenDomain) -> eip712.Signature | Refusal:
    """The canonical signature of ``auth`` if it recovers to ``from``, else the refusal."""
    if len(auth.nonce) != 32:
        return Refusal("invalid_exact_evm_payload_signature", "the nonce must be 32 bytes")
    try:
        signature = eip712.parse_signature(auth.signature)
    except ValueError as exc:
        return Refusal("invalid_exact_evm_payload_signature", f"signature is not canonical: {exc}")
    typed = eip712.transfer_with_authorization(
        chain_id=domain.chain_id,
        usdc=domain.address,
        payer=auth.payer,
        to=auth.to,
        value=auth.value,
        valid_after=auth.valid_after,
        valid_before=auth.valid_before,
        nonce=auth.nonce,
        name=domain.name,
        version=domain.version,
    )
    try:
        signer = eip712.recover_signer(typed, signature)
    except ValueError:
        return Refusal("invalid_exact_evm_payload_signature", "signature does not recover")
    if signer.lower() != auth.payer.lower():
        return Refusal("invalid_exact_evm_payload_signature", "signature is not from `from`")
    return signature
