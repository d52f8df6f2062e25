"""The retirement struct hash and the EIP-3009 nonce that binds it (mirrors
RetirementSettlement.hashRetirement / authorizationNonce). The known-answer test against the
deployed contract lives in the integration suite; here: sensitivity to every field, the type
strings against the Solidity source, and agreement with an independent EIP-712 encoder."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from eth_account._utils.encode_typed_data.encoding_and_hashing import encode_type, hash_struct
from eth_utils.crypto import keccak

from relayer.domain.retirement import (
    DETAILS_TYPE,
    DETAILS_TYPEHASH,
    RETIREMENT_TYPE,
    RETIREMENT_TYPEHASH,
    SOURCE_CARBON_CLASS,
    SOURCE_LISTING,
    Retirement,
    RetirementDetails,
    bind_nonce,
)

SETTLEMENT_SOL = Path(__file__).resolve().parents[2] / "contracts" / "src" / "RetirementSettlement.sol"

PAYER = "0x1111111111111111111111111111111111111111"
BENEFICIARY = "0x2222222222222222222222222222222222222222"
CREDITS = "0x3333333333333333333333333333333333333333"
USDC = "0x4444444444444444444444444444444444444444"
OTHER = "0x5555555555555555555555555555555555555555"
SALT = bytes.fromhex("ab" * 32)

DETAILS = RetirementDetails(
    retiring_address=PAYER,
    beneficiary_address=BENEFICIARY,
    beneficiary_string="Acme Ltd",
    retiring_entity_string="Acme Ops",
    retirement_message="Scope 3, FY2024",
    beneficiary_location="Berlin",
    consumption_country_code="DE",
    consumption_period_start="2024-01-01",
    consumption_period_end="2024-12-31",
)
RETIREMENT = Retirement(
    source=SOURCE_CARBON_CLASS,
    source_id=1,
    credit_token=CREDITS,
    token_id=7,
    amount=1500,
    input_token=USDC,
    gas_allowance=360_000,
    details=DETAILS,
)


def _solidity_type_strings() -> dict[str, str]:
    text = SETTLEMENT_SOL.read_text(encoding="utf-8")
    found = re.findall(
        r"bytes32\s+public\s+constant\s+(\w+_TYPEHASH)\s*=\s*keccak256\(\s*\"([^\"]*)\"\s*\)", text
    )
    return dict(found)


def test_type_strings_equal_the_solidity_source() -> None:
    strings = _solidity_type_strings()
    assert set(strings) == {"RETIREMENT_DETAILS_TYPEHASH", "RETIREMENT_TYPEHASH"}
    assert strings["RETIREMENT_DETAILS_TYPEHASH"] == DETAILS_TYPE
    assert strings["RETIREMENT_TYPEHASH"] == RETIREMENT_TYPE
    assert keccak(text=strings["RETIREMENT_DETAILS_TYPEHASH"]) == DETAILS_TYPEHASH
    assert keccak(text=strings["RETIREMENT_TYPEHASH"]) == RETIREMENT_TYPEHASH


def test_source_constants_equal_the_solidity_source() -> None:
    text = SETTLEMENT_SOL.read_text(encoding="utf-8")
    assert f"SOURCE_CARBON_CLASS = {SOURCE_CARBON_CLASS};" in text
    assert f"SOURCE_LISTING = {SOURCE_LISTING};" in text
    assert (SOURCE_CARBON_CLASS, SOURCE_LISTING) == (0, 1)


# An independent EIP-712 encoder (eth_account's): hashRetirement is EIP-712 hashStruct.
EIP712_TYPES: dict[str, list[dict[str, str]]] = {
    "Retirement": [
        {"name": "source", "type": "uint8"},
        {"name": "sourceId", "type": "uint256"},
        {"name": "creditToken", "type": "address"},
        {"name": "tokenId", "type": "uint256"},
        {"name": "amount", "type": "uint256"},
        {"name": "inputToken", "type": "address"},
        {"name": "gasAllowance", "type": "uint256"},
        {"name": "details", "type": "RetirementDetails"},
    ],
    "RetirementDetails": [
        {"name": "retiringAddress", "type": "address"},
        {"name": "beneficiaryAddress", "type": "address"},
        {"name": "beneficiaryString", "type": "string"},
        {"name": "retiringEntityString", "type": "string"},
        {"name": "retirementMessage", "type": "string"},
        {"name": "beneficiaryLocation", "type": "string"},
        {"name": "consumptionCountryCode", "type": "string"},
        {"name": "consumptionPeriodStart", "type": "string"},
        {"name": "consumptionPeriodEnd", "type": "string"},
    ],
}


def _eip712_message(r: Retirement) -> dict[str, Any]:
    d = r.details
    return {
        "source": r.source,
        "sourceId": r.source_id,
        "creditToken": r.credit_token,
        "tokenId": r.token_id,
        "amount": r.amount,
        "inputToken": r.input_token,
        "gasAllowance": r.gas_allowance,
        "details": {
            "retiringAddress": d.retiring_address,
            "beneficiaryAddress": d.beneficiary_address,
            "beneficiaryString": d.beneficiary_string,
            "retiringEntityString": d.retiring_entity_string,
            "retirementMessage": d.retirement_message,
            "beneficiaryLocation": d.beneficiary_location,
            "consumptionCountryCode": d.consumption_country_code,
            "consumptionPeriodStart": d.consumption_period_start,
            "consumptionPeriodEnd": d.consumption_period_end,
        },
    }


def test_type_strings_are_canonical_eip712_encode_type() -> None:
    assert encode_type("Retirement", EIP712_TYPES) == RETIREMENT_TYPE
    assert encode_type("RetirementDetails", EIP712_TYPES) == DETAILS_TYPE


@pytest.mark.parametrize(
    "retirement",
    [
        RETIREMENT,
        dataclasses.replace(
            RETIREMENT,
            source=SOURCE_LISTING,
            source_id=2**256 - 1,
            amount=1,
            gas_allowance=0,
            details=RetirementDetails(PAYER, BENEFICIARY),
        ),
        dataclasses.replace(
            RETIREMENT,
            details=dataclasses.replace(DETAILS, retirement_message="Klimaneutral ✓ — 二酸化炭素 " * 20),
        ),
    ],
    ids=["full", "listing-empty-strings", "unicode"],
)
def test_struct_hash_equals_independent_eip712_hash_struct(retirement: Retirement) -> None:
    message = _eip712_message(retirement)
    assert retirement.struct_hash() == hash_struct("Retirement", EIP712_TYPES, message)
    assert retirement.details.struct_hash() == hash_struct(
        "RetirementDetails", EIP712_TYPES, message["details"]
    )


def test_struct_hash_is_deterministic_and_32_bytes() -> None:
    h = RETIREMENT.struct_hash()
    assert isinstance(h, bytes)
    assert len(h) == 32
    assert dataclasses.replace(RETIREMENT).struct_hash() == h


# Each field's alternative value; every one must change the hash.
RETIREMENT_CHANGES: dict[str, Any] = {
    "source": SOURCE_LISTING,
    "source_id": 2,
    "credit_token": OTHER,
    "token_id": 8,
    "amount": 1501,
    "input_token": OTHER,
    "gas_allowance": 360_001,
}
DETAILS_CHANGES: dict[str, str] = {
    "retiring_address": OTHER,
    "beneficiary_address": OTHER,
    "beneficiary_string": "Acme Ltd.",
    "retiring_entity_string": "Acme Ops ",
    "retirement_message": "Scope 3, FY2025",
    "beneficiary_location": "Bonn",
    "consumption_country_code": "FR",
    "consumption_period_start": "2024-01-02",
    "consumption_period_end": "2024-12-30",
}


def test_change_lists_cover_every_field() -> None:
    assert set(RETIREMENT_CHANGES) | {"details"} == {f.name for f in dataclasses.fields(Retirement)}
    assert set(DETAILS_CHANGES) == {f.name for f in dataclasses.fields(RetirementDetails)}


@pytest.mark.parametrize(("field", "value"), sorted(RETIREMENT_CHANGES.items()))
def test_struct_hash_changes_with_each_retirement_field(field: str, value: Any) -> None:
    changed = dataclasses.replace(RETIREMENT, **{field: value})
    assert changed.struct_hash() != RETIREMENT.struct_hash()
    assert bind_nonce(changed, SALT) != bind_nonce(RETIREMENT, SALT)


@pytest.mark.parametrize(("field", "value"), sorted(DETAILS_CHANGES.items()))
def test_struct_hash_changes_with_each_details_field(field: str, value: str) -> None:
    details = dataclasses.replace(DETAILS, **{field: value})
    changed = dataclasses.replace(RETIREMENT, details=details)
    assert details.struct_hash() != DETAILS.struct_hash()
    assert changed.struct_hash() != RETIREMENT.struct_hash()
    assert bind_nonce(changed, SALT) != bind_nonce(RETIREMENT, SALT)


def test_all_single_field_changes_give_distinct_hashes() -> None:
    hashes = {RETIREMENT.struct_hash()}
    for field, value in RETIREMENT_CHANGES.items():
        hashes.add(dataclasses.replace(RETIREMENT, **{field: value}).struct_hash())
    for field, text in DETAILS_CHANGES.items():
        details = dataclasses.replace(DETAILS, **{field: text})
        hashes.add(dataclasses.replace(RETIREMENT, details=details).struct_hash())
    assert len(hashes) == 1 + len(RETIREMENT_CHANGES) + len(DETAILS_CHANGES)


def test_strings_are_not_concatenated_ambiguously() -> None:
    # Moving text from one string field to its neighbour must change the hash.
    a = dataclasses.replace(DETAILS, beneficiary_string="ab", retiring_entity_string="c")
    b = dataclasses.replace(DETAILS, beneficiary_string="a", retiring_entity_string="bc")
    assert a.struct_hash() != b.struct_hash()


def test_address_case_does_not_change_the_hash() -> None:
    checksummed = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
    lower = dataclasses.replace(DETAILS, beneficiary_address=checksummed.lower())
    mixed = dataclasses.replace(DETAILS, beneficiary_address=checksummed)
    assert lower.struct_hash() == mixed.struct_hash()


def test_authorization_nonce_binds_salt_and_retirement() -> None:
    nonce = bind_nonce(RETIREMENT, SALT)
    assert len(nonce) == 32
    assert nonce == bind_nonce(RETIREMENT, bytes(SALT))
    assert bind_nonce(RETIREMENT, bytes(32)) != nonce
    assert bind_nonce(RETIREMENT, SALT[:-1] + b"\xac") != nonce
    # keccak256(abi.encode(hashRetirement(r), salt)): two 32-byte words, no packing
    assert nonce == keccak(RETIREMENT.struct_hash() + SALT)
    assert nonce != RETIREMENT.struct_hash()


def test_as_tuple_is_the_abi_order() -> None:
    assert RETIREMENT.as_tuple() == (
        0,
        1,
        CREDITS,
        7,
        1500,
        USDC,
        360_000,
        (
            PAYER,
            BENEFICIARY,
            "Acme Ltd",
            "Acme Ops",
            "Scope 3, FY2024",
            "Berlin",
            "DE",
            "2024-01-01",
            "2024-12-31",
        ),
    )
