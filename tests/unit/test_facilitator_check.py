"""The facilitator's pure checks (:meth:`Facilitator.check`), cheapest first, each with the
x402 spec's reason name; no chain, no database."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, cast

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from relayer.domain import eip712
from relayer.domain.verify import Refusal, TokenDomain, TransferAuthorization, VerifiedTransfer
from relayer.domain.x402_wire import Payment, Requirements
from relayer.service.payments.facilitator import Facilitator
from relayer.service.relay import Relay

USDC = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = TokenDomain(84532, USDC, "USDC", "2")
PAYER = Account.create()
PAY_TO = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
NOW = int(time.time())


def facilitator() -> Facilitator:
    return Facilitator(cast(Relay, None), DOMAIN, ["0x" + "11" * 20], 20.0, 0)


def requirements(**change: Any) -> Requirements:
    base = Requirements(
        "exact", "eip155:84532", USDC, 2_500_000, PAY_TO, 300, {"name": "USDC", "version": "2"}
    )
    return dataclasses.replace(base, **change)


def signed(value: int = 2_500_000, to: str = PAY_TO, valid_before: int = NOW + 300) -> TransferAuthorization:
    nonce = os.urandom(32)
    typed = eip712.transfer_with_authorization(
        chain_id=DOMAIN.chain_id,
        usdc=USDC,
        payer=PAYER.address,
        to=to,
        value=value,
        valid_after=0,
        valid_before=valid_before,
        nonce=nonce,
        name="USDC",
        version="2",
    )
    sig = Account.sign_message(encode_typed_data(full_message=typed), PAYER.key).signature
    return TransferAuthorization(PAYER.address, to, value, 0, valid_before, nonce, bytes(sig))


def test_a_good_payment_is_verified() -> None:
    out = facilitator().check(Payment(requirements(), requirements(), signed()), NOW)
    assert isinstance(out, VerifiedTransfer) and out.payer == PAYER.address and out.value == 2_500_000


@pytest.mark.parametrize(
    ("required", "accepted", "reason"),
    [
        ({"scheme": "upto"}, {}, "unsupported_scheme"),
        ({}, {"scheme": "upto"}, "unsupported_scheme"),
        ({"network": "eip155:8453"}, {}, "invalid_network"),
        ({}, {"network": "base-sepolia"}, "invalid_network"),
        ({"asset": PAY_TO}, {"asset": PAY_TO}, "invalid_payment_requirements"),
        ({}, {"amount": 1}, "invalid_payment_requirements"),
        ({}, {"max_timeout_s": 1}, "invalid_payment_requirements"),
        ({"extra": {}}, {"extra": {}}, "missing_eip712_domain"),
        ({"extra": {"name": "USD Coin", "version": "2"}}, {}, "invalid_payment_requirements"),
    ],
)
def test_requirements_refused_with_their_reason(
    required: dict[str, Any], accepted: dict[str, Any], reason: str
) -> None:
    accepted = (
        {"max_timeout_s": accepted.pop("maxTimeoutSeconds")} | accepted
        if "maxTimeoutSeconds" in accepted
        else accepted
    )
    payment = Payment(requirements(**required), requirements(**accepted), signed())
    out = facilitator().check(payment, NOW)
    assert isinstance(out, Refusal) and out.reason == reason, out


def test_addresses_compare_case_insensitively() -> None:
    lower = requirements(pay_to=PAY_TO.lower(), asset=USDC.lower())
    assert isinstance(facilitator().check(Payment(lower, requirements(), signed()), NOW), VerifiedTransfer)


@pytest.mark.parametrize(
    ("auth", "reason"),
    [
        (lambda: signed(value=1), "invalid_exact_evm_payload_authorization_value_mismatch"),
        (lambda: signed(to=USDC), "invalid_exact_evm_payload_recipient_mismatch"),
        (lambda: signed(valid_before=NOW + 25), "invalid_exact_evm_payload_authorization_valid_before"),
    ],
)
def test_authorizations_refused_with_their_reason(auth: Any, reason: str) -> None:
    out = facilitator().check(Payment(requirements(), requirements(), auth()), NOW)
    assert isinstance(out, Refusal) and out.reason == reason, out
