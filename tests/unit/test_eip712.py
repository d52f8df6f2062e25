"""EIP-712 typed data for the two gasless schemes and signer recovery, signed with eth_account
exactly as a wallet would (``eth_signTypedData_v4`` JSON)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from relayer.domain.eip712 import (
    SECP256K1_N,
    Signature,
    parse_signature,
    permit,
    receive_with_authorization,
    recover_signer,
    usdc_domain_name,
)

PAYER_KEY = "0x" + "4c" * 32
OTHER_KEY = "0x" + "5d" * 32
PAYER = Account.from_key(PAYER_KEY).address
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
KVCM = "0x6B175474E89094C44Da98b954EedeAC495271d0F"
SETTLEMENT = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
NONCE = bytes.fromhex("0f" * 32)


def _usdc_td(chain_id: int = 84532, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "chain_id": chain_id,
        "usdc": USDC,
        "payer": PAYER,
        "settlement": SETTLEMENT,
        "value": 10_360_000,
        "valid_after": 0,
        "valid_before": 1_900_000_000,
        "nonce": NONCE,
    }
    args.update(overrides)
    return receive_with_authorization(**args)


def _permit_td(chain_id: int = 8453) -> dict[str, Any]:
    return permit(
        chain_id=chain_id,
        kvcm=KVCM,
        owner=PAYER,
        spender=SETTLEMENT,
        value=33 * 10**18,
        nonce=3,
        deadline=1_900_000_000,
    )


def _sign(td: dict[str, Any], key: str = PAYER_KEY) -> Signature:
    signed = Account.sign_message(encode_typed_data(full_message=td), key)
    return parse_signature(bytes(signed.signature))


@pytest.mark.parametrize("make", [_usdc_td, _permit_td], ids=["eip3009", "eip2612"])
def test_recover_signer_returns_the_signer(make: Any) -> None:
    td = make()
    sig = _sign(td)
    assert len(bytes(sig)) == 65
    assert recover_signer(td, sig) == PAYER
    other = Account.from_key(OTHER_KEY).address
    assert recover_signer(td, _sign(td, OTHER_KEY)) == other != PAYER


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("message", "value", "10360001"),
        ("message", "to", PAYER),
        ("message", "nonce", "0x" + "10" * 32),
        ("message", "validBefore", "1900000001"),
        ("domain", "chainId", 8453),
        ("domain", "verifyingContract", KVCM),
        ("domain", "version", "1"),
    ],
)
def test_tampered_typed_data_recovers_another_address(section: str, key: str, value: Any) -> None:
    td = _usdc_td()
    sig = _sign(td)
    tampered = copy.deepcopy(td)
    assert tampered[section][key] != value
    tampered[section][key] = value
    recovered = recover_signer(tampered, sig)
    assert recovered != PAYER
    assert recovered.startswith("0x")
    assert len(recovered) == 42


def test_usdc_domain_name_per_chain() -> None:
    assert usdc_domain_name(8453) == "USD Coin"
    assert usdc_domain_name(84532) == "USDC"
    assert _usdc_td(8453)["domain"]["name"] == "USD Coin"
    assert _usdc_td(84532)["domain"]["name"] == "USDC"


def test_usdc_typed_data_shape() -> None:
    td = _usdc_td(8453)
    assert td["primaryType"] == "ReceiveWithAuthorization"
    assert td["domain"] == {"name": "USD Coin", "version": "2", "chainId": 8453, "verifyingContract": USDC}
    assert td["message"] == {
        "from": PAYER,
        "to": SETTLEMENT,
        "value": "10360000",
        "validAfter": "0",
        "validBefore": "1900000000",
        "nonce": "0x" + "0f" * 32,
    }
    assert [f["name"] for f in td["types"]["ReceiveWithAuthorization"]] == [
        "from",
        "to",
        "value",
        "validAfter",
        "validBefore",
        "nonce",
    ]


def test_permit_typed_data_shape() -> None:
    td = _permit_td(84532)
    assert td["primaryType"] == "Permit"
    assert td["domain"] == {"name": "kVCM", "version": "1", "chainId": 84532, "verifyingContract": KVCM}
    assert td["message"] == {
        "owner": PAYER,
        "spender": SETTLEMENT,
        "value": str(33 * 10**18),
        "nonce": "3",
        "deadline": "1900000000",
    }


@pytest.mark.parametrize("make", [_usdc_td, _permit_td], ids=["eip3009", "eip2612"])
def test_typed_data_is_json_and_includes_eip712_domain(make: Any) -> None:
    td = make()
    round_tripped = json.loads(json.dumps(td))
    assert round_tripped == td
    domain_fields = [f["name"] for f in td["types"]["EIP712Domain"]]
    assert domain_fields == ["name", "version", "chainId", "verifyingContract"]
    assert set(td["domain"]) == set(domain_fields)
    assert set(td["message"]) == {f["name"] for f in td["types"][td["primaryType"]]}
    # a wallet signs the JSON form; the relayer recovers from its own dict: same signer
    assert recover_signer(td, _sign(round_tripped)) == PAYER


def test_receive_with_authorization_type_matches_the_token_contract() -> None:
    sol = (Path(__file__).resolve().parents[2] / "contracts" / "src" / "UsdcEip3009.sol").read_text("utf-8")
    fields = ",".join(f"{f['type']} {f['name']}" for f in _usdc_td()["types"]["ReceiveWithAuthorization"])
    assert f'"ReceiveWithAuthorization({fields})"' in sol


@pytest.mark.parametrize(("v_in", "v_out"), [(0, 27), (1, 28), (27, 27), (28, 28)])
def test_parse_signature_normalises_v(v_in: int, v_out: int) -> None:
    r, s = bytes(range(32)), bytes(range(32, 64))
    sig = parse_signature(r + s + bytes([v_in]))
    assert (sig.v, sig.r_bytes, sig.s_bytes) == (v_out, r, s)
    assert bytes(sig) == r + s + bytes([v_out])


@pytest.mark.parametrize("v", [2, 26, 29, 35, 36, 100, 255])
def test_parse_signature_rejects_other_v(v: int) -> None:
    with pytest.raises(ValueError, match="v must be"):
        parse_signature(bytes([1]) * 64 + bytes([v]))


@pytest.mark.parametrize("length", [0, 64, 66, 130])
def test_parse_signature_rejects_wrong_length(length: int) -> None:
    with pytest.raises(ValueError, match="65 bytes"):
        parse_signature(bytes([27]) * length)


HALF_N = SECP256K1_N // 2
ONE = (1).to_bytes(32, "big")


@pytest.mark.parametrize(
    ("r", "s", "match"),
    [
        (0, 1, "r out of range"),
        (SECP256K1_N, 1, "r out of range"),
        (2**256 - 1, 1, "r out of range"),
        (1, 0, "s out of range"),
        (1, SECP256K1_N, "s out of range"),
        (1, HALF_N + 1, "high-s"),
        (1, SECP256K1_N - 1, "high-s"),
    ],
    ids=["r=0", "r=n", "r=max", "s=0", "s=n", "s=n/2+1", "s=n-1"],
)
def test_parse_signature_rejects_non_canonical_r_s(r: int, s: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_signature(r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([27]))


def test_parse_signature_accepts_the_low_s_boundary() -> None:
    sig = parse_signature(ONE + HALF_N.to_bytes(32, "big") + bytes([28]))
    assert (sig.v, sig.r, sig.s) == (28, 1, HALF_N)


def test_all_zero_signature_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_signature(bytes(65))


def test_high_s_twin_of_a_real_signature_is_refused() -> None:
    """The malleable twin (n - s, flipped v) recovers the same signer but is not canonical."""
    td = _usdc_td()
    sig = _sign(td)
    twin = sig.r_bytes + (SECP256K1_N - sig.s).to_bytes(32, "big") + bytes([55 - sig.v])
    with pytest.raises(ValueError, match="high-s"):
        parse_signature(twin)


def test_a_real_signature_round_trips_and_recovers() -> None:
    td = _usdc_td()
    raw = bytes(Account.sign_message(encode_typed_data(full_message=td), PAYER_KEY).signature)
    sig = parse_signature(raw)
    assert sig.v in (27, 28)
    assert bytes(sig) == raw  # eth_account signs with v = 27/28 and low s
    assert recover_signer(td, sig) == PAYER


def test_recovery_failure_is_a_value_error() -> None:
    # r = 5 is not the x coordinate of a point on secp256k1 (no y with y^2 = x^3 + 7).
    sig = Signature(27, 5, 1)
    with pytest.raises(ValueError, match="does not recover"):
        recover_signer(_usdc_td(), sig)


def test_recovery_is_eth_accounts_for_random_keys_and_both_parities() -> None:
    """The libsecp256k1 recovery names the signer eth-account names, for either ``v``."""
    td = _usdc_td()
    message = encode_typed_data(full_message=td)
    parities = set()
    for _ in range(40):
        account = Account.create()
        raw = bytes(Account.sign_message(message, account.key).signature)
        sig = parse_signature(raw)
        parities.add(sig.v)
        assert recover_signer(td, sig) == account.address == Account.recover_message(message, signature=raw)
    assert parities == {27, 28}


@pytest.mark.parametrize(
    "sig",
    [
        Signature(29, 1, 1),
        Signature(26, 1, 1),
        Signature(27, 0, 1),
        Signature(27, 1, 0),
        Signature(27, SECP256K1_N, 1),
        Signature(28, 1, SECP256K1_N),
    ],
)
def test_a_signature_out_of_range_does_not_recover(sig: Signature) -> None:
    with pytest.raises(ValueError, match="does not recover"):
        recover_signer(_usdc_td(), sig)
