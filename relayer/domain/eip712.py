"""EIP-712 typed data for the two gasless schemes, in the ``eth_signTypedData_v4`` JSON form
(``domain``, ``types`` including ``EIP712Domain``, ``primaryType``, ``message``) that any
wallet library signs unchanged; canonical signatures and signer recovery. uint256 values
are decimal strings.

- USDC: EIP-3009 ``ReceiveWithAuthorization`` (domain name per chain from
  :func:`relayer.domain.chains.usdc_domain_name`: ``USD Coin`` on 8453, ``USDC`` on 84532;
  version ``2``).
- kVCM: EIP-2612 ``Permit`` (domain name ``kVCM``, version ``1``).
- USDC transfers (the ``transfer`` job kind: x402 ``exact`` payments and refunds): EIP-3009
  ``TransferWithAuthorization`` (same domain as ``ReceiveWithAuthorization``, or the one the
  caller names).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

import coincurve
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak

from relayer.domain.abi_words import address_word, bytes32_word, uint_word
from relayer.domain.addresses import checksum_address
from relayer.domain.chains import usdc_domain_name

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
TRANSFER_WITH_AUTHORIZATION_FIELDS: Final = RECEIVE_WITH_AUTHORIZATION_FIELDS  # same fields
PERMIT_FIELDS: Final = [
    {"name": "owner", "type": "address"},
    {"name": "spender", "type": "address"},
    {"name": "value", "type": "uint256"},
    {"name": "nonce", "type": "uint256"},
    {"name": "deadline", "type": "uint256"},
]


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


def transfer_with_authorization(
    *,
    chain_id: int,
    usdc: str,
    payer: str,
    to: str,
    value: int,
    valid_after: int,
    valid_before: int,
    nonce: bytes,
    name: str | None = None,
    version: str = "2",
) -> dict[str, Any]:
    """Typed data of an EIP-3009 TransferWithAuthorization of ``value`` USDC atomic units from
    ``payer`` to ``to`` (validity bounds in unix seconds, ``nonce`` any 32 bytes the payer
    chose). The domain is the token's: ``name`` defaults to
    :func:`relayer.domain.chains.usdc_domain_name` of ``chain_id``, ``version`` to ``2``."""
    return {
        "domain": {
            "name": usdc_domain_name(chain_id) if name is None else name,
            "version": version,
            "chainId": chain_id,
            "verifyingContract": usdc,
        },
        "types": {
            "EIP712Domain": DOMAIN_FIELDS,
            "TransferWithAuthorization": TRANSFER_WITH_AUTHORIZATION_FIELDS,
        },
        "primaryType": "TransferWithAuthorization",
        "message": {
            "from": payer,
            "to": to,
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


SECP256K1_N: Final = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_HALF_N: Final = SECP256K1_N // 2


@dataclass(frozen=True, slots=True)
class Signature:
    """A canonical secp256k1 signature: ``v`` in {27, 28}, ``0 < r < n``, ``0 < s <= n/2``
    (low-s, as OpenZeppelin's ECDSA and EIP-2 require)."""

    v: int
    r: int
    s: int

    @property
    def r_bytes(self) -> bytes:
        return self.r.to_bytes(32, "big")

    @property
    def s_bytes(self) -> bytes:
        return self.s.to_bytes(32, "big")

    def __bytes__(self) -> bytes:
        """65-byte r||s||v."""
        return self.r_bytes + self.s_bytes + bytes([self.v])


def parse_signature(raw: bytes) -> Signature:
    """Parse a 65-byte r||s||v signature and insist it is canonical; ``v`` 0/1 becomes 27/28.

    Raises:
        ValueError: not 65 bytes, ``v`` not in {0, 1, 27, 28}, ``r`` or ``s`` zero or not
            below the curve order, or ``s`` in the upper half (malleable high-s form).
    """
    if len(raw) != 65:
        raise ValueError("signature must be 65 bytes")
    v = raw[64] + 27 if raw[64] < 27 else raw[64]
    if v not in (27, 28):
        raise ValueError("signature v must be 27 or 28 (or 0/1)")
    r, s = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big")
    if not 0 < r < SECP256K1_N:
        raise ValueError("signature r out of range")
    if not 0 < s < SECP256K1_N:
        raise ValueError("signature s out of range")
    if s > _HALF_N:
        raise ValueError("signature s is in the upper half (high-s): not canonical")
    return Signature(v, r, s)


def typed_data_digest(typed_data: dict[str, Any]) -> bytes:
    """The 32-byte EIP-712 digest ``keccak256(0x19 0x01 domainSeparator structHash)``.

    The typed data this module builds (the domain of :data:`DOMAIN_FIELDS`, a primary type
    of ``address``, ``uint256``, ``bytes32`` and ``string`` fields, uint256 values as ints
    or decimal strings) is hashed here word by word, its domain separator cached (about 60
    µs, against 350 µs through eth_account); anything else goes to eth_account's
    ``encode_typed_data`` unchanged (its leniencies and its errors).

    Raises:
        ValueError, TypeError: the typed data is malformed.
    """
    fast = _flat_digest(typed_data)
    if fast is not None:
        return fast
    signable = encode_typed_data(full_message=typed_data)
    return keccak(b"\x19" + signable.version + signable.header + signable.body)


_DOMAIN_KEYS: Final = frozenset(field["name"] for field in DOMAIN_FIELDS)
_DECIMAL: Final = frozenset("0123456789")


def _flat_digest(typed_data: dict[str, Any]) -> bytes | None:
    """The digest of typed data whose domain is exactly :data:`DOMAIN_FIELDS` and whose only
    other type is its primary type, of ``address``, ``uint256``, ``bytes32`` and ``string``
    fields, every value present and in a form read here one way only (an address 0x and 40
    hex digits, a uint256 an int or a decimal string without a sign or leading zero, a
    bytes32 0x and 64 hex digits, a string a str); None for anything else."""
    try:
        types, primary = typed_data["types"], typed_data["primaryType"]
        if types.get("EIP712Domain") != DOMAIN_FIELDS or set(types) != {"EIP712Domain", primary}:
            return None
        domain = typed_data["domain"]
        if set(domain) != _DOMAIN_KEYS:
            return None
        domain_words = [
            _word("string", domain["name"]),
            _word("string", domain["version"]),
            _word("uint256", domain["chainId"]),
            _word("address", domain["verifyingContract"]),
        ]
        fields = types[primary]
        message = typed_data["message"]
        words = [_word(f["type"], message[f["name"]]) for f in fields]
        type_hash = _type_hash(primary, tuple((f["type"], f["name"]) for f in fields))
    except (KeyError, TypeError, AttributeError, ValueError):
        return None
    if None in domain_words or None in words:
        return None  # a type or a value form left to eth_account
    separator = _domain_separator(*(w for w in domain_words if w is not None))
    return keccak(b"\x19\x01" + separator + keccak(type_hash + b"".join(w for w in words if w is not None)))


@lru_cache(maxsize=64)
def _domain_separator(name: bytes, version: bytes, chain_id: bytes, contract: bytes) -> bytes:
    """The domain separator of the domain whose four words are these."""
    return keccak(_DOMAIN_TYPE_HASH + name + version + chain_id + contract)


@lru_cache(maxsize=64)
def _type_hash(name: str, fields: tuple[tuple[str, str], ...]) -> bytes:
    """keccak256 of ``name(type field,...)``: the type hash of a struct without references."""
    return keccak(f"{name}({','.join(f'{t} {n}' for t, n in fields)})".encode())


def _word(kind: str, value: Any) -> bytes | None:
    """The EIP-712 encoding of ``value`` as ``kind`` (one word); None for another type, or a
    value in a form eth_account may read otherwise.

    Raises:
        ValueError: an address that is not 0x and 40 hex digits.
    """
    if kind == "address" and isinstance(value, str):
        return address_word(value)
    if kind == "uint256":
        if (
            isinstance(value, str)
            and value
            and _DECIMAL.issuperset(value)
            and (value == "0" or value[0] != "0")
        ):
            value = int(value)
        if type(value) is int and 0 <= value < 1 << 256:
            return uint_word(value)
    if kind == "bytes32" and isinstance(value, str) and len(value) == 66 and value.startswith("0x"):
        return bytes32_word(bytes.fromhex(value[2:]))
    if kind == "string" and isinstance(value, str):
        return keccak(value.encode())
    return None


_DOMAIN_TYPE_HASH: Final = _type_hash("EIP712Domain", tuple((f["type"], f["name"]) for f in DOMAIN_FIELDS))


def recover_signer(typed_data: dict[str, Any], signature: Signature) -> str:
    """Checksummed address that signed ``typed_data``: the public key libsecp256k1
    (coincurve) recovers from the digest and ``signature``, hashed to its address; the same
    answer as eth-keys' recovery at under half its cost (a unit test holds it to
    eth-account's for random keys), on every request that carries a signature.

    Raises:
        ValueError: no public key recovers from the signature (``v`` not 27 or 28, ``r`` or
            ``s`` not in 1 .. n-1, ``r`` not the x coordinate of a curve point), or the
            typed data is malformed.
    """
    digest = typed_data_digest(typed_data)
    v, r, s = signature.v, signature.r, signature.s
    if v not in (27, 28) or not 0 < r < SECP256K1_N or not 0 < s < SECP256K1_N:
        raise ValueError("signature does not recover: v, r or s out of range")
    compact = r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([v - 27])
    try:
        public = coincurve.PublicKey.from_signature_and_message(compact, digest, hasher=None)
    except ValueError:
        raise ValueError("signature does not recover: no public key") from None
    return checksum_address(keccak(public.format(compressed=False)[1:])[-20:].hex())
