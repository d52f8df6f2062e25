"""Call data of the settlement and token calls the relay makes, as plain functions of the
domain types (no client instance). Amounts are atomic units; signatures are canonical.
Spec: prepare/retire (``[approve, retire]``) and actions/retire (the two gasless paths)."""

from __future__ import annotations

from typing import Any

from relayer.chain import codec
from relayer.domain.eip712 import Signature
from relayer.domain.retirement import Retirement, RetirementDetails

SETTLEMENT = "RetirementSettlement"
TOKEN = "UsdcEip3009"
_TRANSFER_WITH_AUTHORIZATION = codec.function(TOKEN, "transferWithAuthorization")
TRANSFER_SELECTOR = _TRANSFER_WITH_AUTHORIZATION.selector
"""``0xe3ee160e``: ``transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,
uint8,bytes32,bytes32)``."""


def approve(token_contract: str, spender: str, amount: int) -> bytes:
    """ERC-20 ``approve(spender, amount)`` on ``token_contract`` (``UsdcEip3009`` or ``KlimaVcm``)."""
    return codec.function(token_contract, "approve").encode(spender, amount)


def retire(retirement: Retirement, max_input: int) -> bytes:
    """The caller-paid ``retire(r, maxInput)`` (the retirement's gas allowance must be 0)."""
    return codec.function(SETTLEMENT, "retire").encode(retirement.as_tuple(), max_input)


def retire_with_authorization(
    retirement: Retirement,
    salt: bytes,
    payer: str,
    value: int,
    valid_after: int,
    valid_before: int,
    signature: Signature,
) -> bytes:
    """The USDC gasless path: ``retireWithAuthorization(r, salt, (from, value, validAfter,
    validBefore, v, r, s))``; the contract recomputes the EIP-3009 nonce from ``r`` and ``salt``."""
    auth = (payer, value, valid_after, valid_before, signature.v, signature.r_bytes, signature.s_bytes)
    return codec.function(SETTLEMENT, "retireWithAuthorization").encode(retirement.as_tuple(), salt, auth)


def retire_with_permit(
    retirement: Retirement, salt: bytes, owner: str, value: int, deadline: int, signature: Signature
) -> bytes:
    """The kVCM gasless path: ``retireWithPermit(r, salt, (owner, value, deadline, v, r, s))``;
    the deadline carries the bound nonce's high 192 bits and the expiry in its low 64."""
    permit = (owner, value, deadline, signature.v, signature.r_bytes, signature.s_bytes)
    return codec.function(SETTLEMENT, "retireWithPermit").encode(retirement.as_tuple(), salt, permit)


def transfer_with_authorization(
    payer: str,
    to: str,
    value: int,
    valid_after: int,
    valid_before: int,
    nonce: bytes,
    signature: Signature,
) -> bytes:
    """EIP-3009 ``transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v,
    r, s)`` on the token (the v,r,s overload, selector ``0xe3ee160e``): 4 + 9 * 32 bytes.
    ``value`` in the token's atomic units, validity bounds in unix seconds, ``nonce`` the
    authorization's 32 bytes.

    Raises:
        ValueError: an argument out of its ABI type's range (eth_abi's encoding error).
    """
    return _TRANSFER_WITH_AUTHORIZATION.encode(
        payer, to, value, valid_after, valid_before, nonce, signature.v, signature.r_bytes, signature.s_bytes
    )


def relayed_function(kind: str, scheme: str) -> codec.FunctionAbi:
    """The function a relay job's transaction calls: ``transferWithAuthorization`` on the token
    for a ``transfer`` job, else the settlement's ``retireWithAuthorization`` (``eip3009``) or
    ``retireWithPermit`` (``eip2612``)."""
    if kind == "transfer":
        return _TRANSFER_WITH_AUTHORIZATION
    return codec.function(
        SETTLEMENT, "retireWithAuthorization" if scheme == "eip3009" else "retireWithPermit"
    )


def gasless_call_size(retirement: Retirement, scheme: str) -> int:
    """Bytes of call data of the gasless settlement of ``retirement`` (``eip3009`` or
    ``eip2612``): fixed but for the details' strings, so placeholders stand in for the
    salt, the amounts and the signature. What Base's L1 data fee grows with."""
    blank, zero = b"\x00" * 32, Signature(27, 1, 1)
    if scheme == "eip3009":
        return len(retire_with_authorization(retirement, blank, _ZERO_ADDRESS, 0, 0, 0, zero))
    return len(retire_with_permit(retirement, blank, _ZERO_ADDRESS, 0, 0, zero))


_ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"


def stored_text(value: str | bytes) -> str:
    """On-chain text as the daemon keeps it: invalid UTF-8 and NUL (which Postgres text
    cannot hold) become U+FFFD."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return text.replace("\x00", "\ufffd")


def retirement_from_tuple(value: Any) -> Retirement:
    """A decoded ABI ``Retirement`` tuple (as in the ``RetirementSettled`` event) as the
    domain type; details strings may come as bytes and go through :func:`stored_text`."""
    source, source_id, credit_token, token_id, amount, input_token, gas_allowance, details = value
    return Retirement(
        source=int(source),
        source_id=int(source_id),
        credit_token=str(credit_token),
        token_id=int(token_id),
        amount=int(amount),
        input_token=str(input_token),
        gas_allowance=int(gas_allowance),
        details=RetirementDetails(
            str(details[0]), str(details[1]), *(stored_text(field) for field in details[2:])
        ),
    )
