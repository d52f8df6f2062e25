"""The transfer job kind's pure parts: EIP-3009 TransferWithAuthorization typed data (signed
with eth_account as a wallet would), its call data (against web3's own encoding), the job's
identity keys, and verify_transfer with each refusal. No chain, no database."""

from __future__ import annotations

from dataclasses import replace

import pytest
from eth_abi.abi import encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from web3 import Web3

from relayer.chain import calls
from relayer.chain.abi import abi
from relayer.domain import eip712
from relayer.domain.eip712 import SECP256K1_N
from relayer.domain.verify import (
    AUTH_EXPIRY_MARGIN_S,
    Refusal,
    TokenDomain,
    TransferAuthorization,
    TransferRequirement,
    VerifiedTransfer,
    transfer_bound_nonce,
    transfer_salt,
    verify_transfer,
)

NOW = 1_800_000_000
PAYER_KEY = "0x" + "4c" * 32
PAYER = Account.from_key(PAYER_KEY).address
OTHER_KEY = "0x" + "5d" * 32
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
PAY_TO = "0x000000000000000000000000000000000000dEaD"
DOMAIN = TokenDomain(84532, USDC, "USDC", "2")
REQUIREMENT = TransferRequirement(asset=USDC, pay_to=PAY_TO, amount=1_250_000)
NONCE = bytes(range(32))
SIG = "invalid_exact_evm_payload_signature"


def typed(auth: TransferAuthorization, domain: TokenDomain = DOMAIN) -> dict[str, object]:
    return eip712.transfer_with_authorization(
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


def signed(key: str = PAYER_KEY, **fields: object) -> TransferAuthorization:
    base = TransferAuthorization(PAYER, PAY_TO, 1_250_000, NOW - 10, NOW + 600, NONCE, b"")
    auth = replace(base, **fields)  # type: ignore[arg-type]
    raw = Account.sign_message(encode_typed_data(full_message=typed(auth)), key).signature
    return replace(auth, signature=bytes(raw))


def test_typed_data_is_the_eip3009_transfer_and_recovers_with_eth_account() -> None:
    auth = signed()
    data = typed(auth)
    assert data["primaryType"] == "TransferWithAuthorization"
    assert [f["name"] for f in data["types"]["TransferWithAuthorization"]] == [  # type: ignore[index]
        "from", "to", "value", "validAfter", "validBefore", "nonce",
    ]  # fmt: skip
    signable = encode_typed_data(full_message=data)
    assert Account.recover_message(signable, signature=auth.signature) == PAYER
    assert eip712.recover_signer(data, eip712.parse_signature(auth.signature)) == PAYER
    # The type hash the token contract uses (EIP-3009).
    type_hash = keccak(
        text="TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,"
        "uint256 validBefore,bytes32 nonce)"
    )
    assert type_hash.hex() == "7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267"
    default = eip712.transfer_with_authorization(
        chain_id=8453, usdc=USDC, payer=PAYER, to=PAY_TO, value=1, valid_after=0, valid_before=1, nonce=NONCE
    )
    assert default["domain"] == {
        "name": "USD Coin",
        "version": "2",
        "chainId": 8453,
        "verifyingContract": USDC,
    }


def test_call_data_matches_web3_encoding() -> None:
    auth = signed()
    sig = eip712.parse_signature(auth.signature)
    data = calls.transfer_with_authorization(
        auth.payer, auth.to, auth.value, auth.valid_after, auth.valid_before, auth.nonce, sig
    )
    assert data[:4].hex() == "e3ee160e" == calls.TRANSFER_SELECTOR.hex()
    assert len(data) == 4 + 9 * 32
    window = [auth.value, auth.valid_after, auth.valid_before]
    args = [auth.payer, auth.to, *window, auth.nonce, sig.v, sig.r_bytes, sig.s_bytes]
    types = ["address", "address", "uint256", "uint256", "uint256", "bytes32", "uint8", "bytes32", "bytes32"]
    assert data[4:] == encode(types, args)
    contract = Web3().eth.contract(address=USDC, abi=abi("UsdcEip3009"))
    expected = contract.encode_abi("transferWithAuthorization", args=args)
    assert "0x" + data.hex() == expected


def test_identity_keys() -> None:
    bound = transfer_bound_nonce(USDC, PAYER, NONCE)
    assert bound == keccak(encode(["address", "address", "bytes32"], [USDC, PAYER, NONCE]))
    assert transfer_salt(bound) == keccak(b"relayer/x402-transfer/v1" + bound)
    assert transfer_bound_nonce(USDC, PAYER, b"\x01" * 32) != bound


def test_a_good_authorization_verifies() -> None:
    auth = signed()
    out = verify_transfer(auth, REQUIREMENT, DOMAIN, NOW)
    assert isinstance(out, VerifiedTransfer), out
    assert (out.payer, out.to, out.value, out.token, out.nonce) == (PAYER, PAY_TO, 1_250_000, USDC, NONCE)
    assert out.bound_nonce == transfer_bound_nonce(USDC, PAYER, NONCE)
    assert out.salt == transfer_salt(out.bound_nonce)
    assert out.expires_at == auth.valid_before
    again = verify_transfer(auth, REQUIREMENT, DOMAIN, NOW)
    assert isinstance(again, VerifiedTransfer) and again.request_hash == out.request_hash
    keyed = verify_transfer(auth, REQUIREMENT, DOMAIN, NOW, request_key=b"\x07" * 32)
    assert isinstance(keyed, VerifiedTransfer) and keyed.request_hash == b"\x07" * 32


def _high_s(raw: bytes) -> bytes:
    s = int.from_bytes(raw[32:64], "big")
    v = 28 if raw[64] in (27, 0) else 27
    return raw[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([v])


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: (signed(), replace(REQUIREMENT, asset=PAY_TO), DOMAIN), "invalid_payment_requirements"),
        (lambda: (signed(to=PAYER), REQUIREMENT, DOMAIN), "invalid_exact_evm_payload_recipient_mismatch"),
        (lambda: (signed(value=1_250_001), REQUIREMENT, DOMAIN),
         "invalid_exact_evm_payload_authorization_value_mismatch"),
        (lambda: (signed(value=1_249_999), REQUIREMENT, DOMAIN),
         "invalid_exact_evm_payload_authorization_value_mismatch"),
        (lambda: (signed(valid_before=NOW - 1), REQUIREMENT, DOMAIN),
         "invalid_exact_evm_payload_authorization_valid_before"),
        (lambda: (signed(valid_before=NOW + AUTH_EXPIRY_MARGIN_S), REQUIREMENT, DOMAIN),
         "invalid_exact_evm_payload_authorization_valid_before"),
        (lambda: (signed(valid_after=NOW + 1), REQUIREMENT, DOMAIN),
         "invalid_exact_evm_payload_authorization_valid_after"),
        (lambda: (signed(OTHER_KEY), REQUIREMENT, DOMAIN), SIG),
        (lambda: (replace(signed(), value=1_250_000, nonce=b"\x09" * 32), REQUIREMENT, DOMAIN),
         SIG),
        (lambda: (signed(), REQUIREMENT, replace(DOMAIN, name="USD Coin")), SIG),
        (lambda: (signed(), REQUIREMENT, replace(DOMAIN, chain_id=8453)), SIG),
        (lambda: (replace(signed(), signature=b"\x01" * 64), REQUIREMENT, DOMAIN),
         SIG),
        (lambda: (replace(signed(), signature=_high_s(signed().signature)), REQUIREMENT, DOMAIN),
         SIG),
        (lambda: (replace(signed(), nonce=b"\x01" * 31), REQUIREMENT, DOMAIN), SIG),
    ],
    ids=[
        "foreign-asset", "recipient", "value-above", "value-below", "expired", "within-margin",
        "not-yet-valid", "other-signer", "tampered-nonce", "other-domain-name", "other-chain",
        "short-signature", "high-s", "short-nonce",
    ],
)  # fmt: skip
def test_each_refusal(make: object, reason: str) -> None:
    auth, requirement, domain = make()  # type: ignore[operator]
    out = verify_transfer(auth, requirement, domain, NOW)
    assert isinstance(out, Refusal), out
    assert out.reason == reason and out.message


def test_addresses_compare_case_insensitively() -> None:
    auth = signed()
    requirement = replace(REQUIREMENT, asset=USDC.lower(), pay_to=PAY_TO.lower())
    assert isinstance(verify_transfer(auth, requirement, DOMAIN, NOW), VerifiedTransfer)
