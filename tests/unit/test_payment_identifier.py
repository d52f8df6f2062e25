"""Pure parts of the facilitator's payment-identifier extension and simulation: reading
``paymentPayload.extensions["payment-identifier"].info.id`` (spec: x402-foundation/x402
specs/extensions/payment_identifier.md, ``id`` Format) and hashing the payload canonically;
what a JSON-RPC ``eth_call`` answer of ``transferWithAuthorization`` says (a revert, the
used nonce, or the node failing)."""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi.abi import encode
from eth_utils.crypto import keccak

from relayer.chain.errors import ChainRevert, ChainUnavailable
from relayer.chain.reads import _revert_of
from relayer.domain.x402_wire import payment_identifier
from relayer.service.payments.facilitator import nonce_used

PAYER = "0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A"


def body(extensions: Any = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "x402Version": 2,
        "payload": {"authorization": {"from": PAYER, "value": "1"}, "signature": "0x" + "1b" * 65},
        "accepted": {"scheme": "exact", "amount": "1"},
    }
    if extensions is not None:
        payload["extensions"] = extensions
    return {"x402Version": 2, "paymentPayload": payload, "paymentRequirements": {}}


def with_info(info: Any) -> dict[str, Any]:
    return body({"payment-identifier": {"info": info, "schema": {"type": "object"}}})


def test_no_extension_or_no_id_is_no_identifier() -> None:
    assert payment_identifier(body()) is None
    assert payment_identifier(body({"bazaar": {}})) is None
    assert payment_identifier(with_info({"required": False})) is None


def test_an_id_is_read_with_the_payloads_canonical_hash() -> None:
    first = payment_identifier(with_info({"required": False, "id": "pay_7d5d747be160e280504c099d984bcfe0"}))
    assert first is not None and first.id == "pay_7d5d747be160e280504c099d984bcfe0"
    assert len(first.payload_hash) == 32
    flipped = with_info({"id": "pay_7d5d747be160e280504c099d984bcfe0", "required": False})
    flipped["paymentPayload"] = dict(reversed(list(flipped["paymentPayload"].items())))
    again = payment_identifier(flipped)
    assert again == first  # the same payload in another key order
    other = with_info({"required": False, "id": "pay_7d5d747be160e280504c099d984bcfe0"})
    other["paymentPayload"]["payload"]["signature"] = "0x" + "1c" * 65
    changed = payment_identifier(other)
    assert changed is not None and changed.payload_hash != first.payload_hash


@pytest.mark.parametrize("pid", ["pay_" + "a" * 12, "a" * 16, "A_-9" * 32])
def test_the_spec_format_is_accepted(pid: str) -> None:
    found = payment_identifier(with_info({"required": True, "id": pid}))
    assert found is not None and found.id == pid


@pytest.mark.parametrize(
    "info",
    [
        {"required": False, "id": "a" * 15},  # under 16
        {"required": False, "id": "a" * 129},  # over 128
        {"required": False, "id": "pay_with space_0123"},
        {"required": False, "id": "pay_ünïcode_0123456"},
        {"required": False, "id": 12345678901234567890},
        {"required": "no", "id": "pay_0123456789abcdef"},
        "pay_0123456789abcdef",
        None,
        [],
    ],
)
def test_a_bad_identifier_is_refused(info: Any) -> None:
    with pytest.raises(ValueError):
        payment_identifier(with_info(info))


def test_an_extension_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError):
        payment_identifier(body({"payment-identifier": "pay_0123456789abcdef"}))


def _custom(signature: str, types: list[str], args: list[Any]) -> str:
    return "0x" + (keccak(text=signature)[:4] + encode(types, args)).hex()


def test_a_call_that_succeeds_is_no_revert() -> None:
    assert _revert_of({"jsonrpc": "2.0", "id": 1, "result": "0x"}) is None


def test_the_used_nonce_is_recognised_on_the_devnet_token_and_on_circles_usdc() -> None:
    used = _custom("AuthorizationAlreadyUsed(address,bytes32)", ["address", "bytes32"], [PAYER, b"\x01" * 32])
    revert = _revert_of({"error": {"code": 3, "message": "execution reverted", "data": used}})
    assert isinstance(revert, ChainRevert) and revert.error_name == "AuthorizationAlreadyUsed"
    assert nonce_used(revert)
    fiat = _custom("Error(string)", ["string"], ["FiatTokenV2: authorization is used or canceled"])
    revert = _revert_of({"error": {"code": 3, "message": "execution reverted", "data": fiat}})
    assert revert is not None and nonce_used(revert)


def test_other_reverts_are_not_the_used_nonce() -> None:
    short = _custom(
        "ERC20InsufficientBalance(address,uint256,uint256)", ["address", "uint256", "uint256"], [PAYER, 1, 2]
    )
    revert = _revert_of({"error": {"code": 3, "message": "execution reverted", "data": short}})
    assert revert is not None and not nonce_used(revert)
    bare = _revert_of({"error": {"code": -32000, "message": "execution reverted"}})
    assert bare is not None and not nonce_used(bare)


@pytest.mark.parametrize(
    "answer",
    [
        {"error": {"code": -32005, "message": "rate limited"}},
        {"error": "boom"},
        {"result": None},
        {},
    ],
)
def test_an_error_that_is_no_revert_is_the_node_failing(answer: dict[str, Any]) -> None:
    with pytest.raises(ChainUnavailable):
        _revert_of(answer)
