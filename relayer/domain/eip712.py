"""EIP-712 typed data for the two gasless schemes, in the ``eth_signTypedData_v4`` JSON form
(``domain``, ``types`` including ``EIP712Domain``, ``primaryType``, ``message``) that any
wallet library signs unchanged, and signer recovery. uint256 values are decimal strings.

- USDC: EIP-3009 ``ReceiveWithAuthorization`` (domain name ``USD Coin`` on 8453, ``USDC``
  on 84532, version ``2``).
- kVCM: EIP-2612 ``Permit`` (domain name ``kVCM``, version ``1``).
"""

from __future__ import annotations

from typing import Any, Final

from eth_account import Account
from eth_account.messages import encode_typed_data

DOMAIN_FIELDS: Final = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]
RECEIVE_WITH_AUTHORIZATION_FIELDS: Final = [
    {"name": "from", "type": "address"},
    {"name": "to", "type": "address"},
    {"name": "value", "type": "uint256"},
    {"name": "validAfter", "type": "uint256"},
    {"name": "validBefore", "type": "uint256"},
    {"name": "nonce", "type": "bytes32"},
]
PERMIT_FIELDS: Final = [
    {"name": "owner", "type": "address"},
    {"name": "spender", "type": "address"},
    {"name": "value", "type": "uint256"},
    {"name": "nonce", "type": "uint256"},
    {"name": "deadline", "type": "uint256"},
]


def usdc_domain_name(chain_id: int) -> str:
    """EIP-712 domain name of USDC on a Base chain (as the real tokens)."""
    return "USD Coin" if chain_id == 8453 else "USDC"


def receive_with_authorization(
    *,
    chain_id: int,
    usdc: str,
    payer: str,
    settlement: str,
    value: int,
    valid_after: int,
    valid_before: int,
    nonce: bytes,
) -> dict[str, Any]:
    """Typed data of an EIP-3009 ReceiveWithAuthorization (value in USDC atomic units,
    validity bounds in unix seconds, nonce the 32-byte bound nonce)."""
    return {
        "domain": {
            "name": usdc_domain_name(chain_id),
            "version": "2",
            "chainId": chain_id,
            "verifyingContract": usdc,
        },
        "types": {
            "EIP712Domain": DOMAIN_FIELDS,
            "ReceiveWithAuthorization": RECEIVE_WITH_AUTHORIZATION_FIELDS,
        },
        "primaryType": "ReceiveWithAuthorization",
        "message": {
            "from": payer,
            "to": settlement,
            "value": str(value),
            "validAfter": str(valid_after),
            "validBefore": str(valid_before),
            "nonce": "0x" + nonce.hex(),
        },
    }


def permit(
    *, chain_id: int, kvcm: str, owner: str, spender: str, value: int, nonce: int, deadline: int
) -> dict[str, Any]:
    """Typed data of an EIP-2612 Permit on kVCM (value in kVCM atomic units)."""
    return {
        "domain": {"name": "kVCM", "version": "1", "chainId": chain_id, "verifyingContract": kvcm},
        "types": {"EIP712Domain": DOMAIN_FIELDS, "Permit": PERMIT_FIELDS},
        "primaryType": "Permit",
        "message": {
            "owner": owner,
            "spender": spender,
            "value": str(value),
            "nonce": str(nonce),
            "deadline": str(deadline),
        },
    }


def recover_signer(typed_data: dict[str, Any], signature: bytes) -> str:
    """Checksummed address that signed ``typed_data`` (65-byte r||s||v signature).

    Raises:
        ValueError: the signature is malformed or does not recover.
    """
    return str(Account.recover_message(encode_typed_data(full_message=typed_data), signature=signature))


def split_signature(signature: bytes) -> tuple[int, bytes, bytes]:
    """(v, r, s) of a 65-byte signature; v normalised to 27/28.

    Raises:
        ValueError: not 65 bytes or v not in {0, 1, 27, 28}.
    """
    if len(signature) != 65:
        raise ValueError("signature must be 65 bytes")
    v = signature[64]
    if v < 27:
        v += 27
    if v not in (27, 28):
        raise ValueError("signature v must be 27 or 28")
    return v, signature[:32], signature[32:64]
