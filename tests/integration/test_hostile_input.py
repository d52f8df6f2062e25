"""Inputs a hostile client crafts, over HTTP against the real daemon: each answers its spec
code (4xx), none answers 500, and random mutations of signed requests never do either."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from relayer.domain.eip712 import SECP256K1_N
from tests.conftest import Daemon
from tests.helpers.relay import challenge, mutate_request, sign, signed_request

pytestmark = pytest.mark.integration


def _with_signature(body: dict[str, Any], raw: bytes) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["authPayload"]["signature"] = "0x" + raw.hex()
    return out


async def _signed(daemon: Daemon, payer_index: int = 0, **fields: Any) -> dict[str, Any]:
    payer = daemon.chain["payers"][payer_index]
    ch = await challenge(
        daemon, payer, **{"carbonClass": "RE", "amount": "0.01", "inputToken": "USDC", **fields}
    )
    return signed_request(ch, payer["privateKey"])


async def test_out_of_range_integers_are_4xx(daemon: Daemon) -> None:
    status, body = await daemon.get("/api/quote", listingId=str(2**256), amount="1")
    assert (status, body["error"]) == (400, "schema_validation"), body
    status, body = await daemon.get("/api/certificate", txHash="0x" + "ab" * 32, index=str(2**40))
    assert (status, body["error"]) == (400, "schema_validation"), body
    status, body = await daemon.get("/api/quote", carbonClass="NBO", amount="1", chainId=str(2**300))
    assert (status, body["error"]) == (400, "schema_validation"), body


@pytest.mark.parametrize(
    "amount",
    ["1e999999", "\u0661", "\uff11", "1e3", "01", "-1", "NaN", "1000000000000", "9" * 5000],
)
async def test_malformed_or_over_range_amounts_are_schema_validation(daemon: Daemon, amount: str) -> None:
    """The one tonne parser on the x402 surface (the marketplace's is test_marketplace)."""
    status, body = await daemon.get("/api/quote", carbonClass="RE", amount=amount, inputToken="USDC")
    assert (status, body["error"]) == (400, "schema_validation"), body


N = SECP256K1_N
ONE = (1).to_bytes(32, "big")


@pytest.mark.parametrize(
    "raw",
    [
        bytes(65),
        bytes(32) + ONE + bytes([27]),
        ONE + N.to_bytes(32, "big") + bytes([27]),
        ONE + ONE + bytes([36]),
        ONE + ONE + bytes([100]),
    ],
    ids=["all-zero", "r=0", "s=n", "v=36", "v=100"],
)
async def test_malformed_signatures_are_invalid_auth_payload(daemon: Daemon, raw: bytes) -> None:
    body = await _signed(daemon)
    status, data = await daemon.post(_with_signature(body, raw))
    assert (status, data["error"]) == (400, "invalid_auth_payload"), data


async def test_high_s_twin_is_refused_before_any_simulation(daemon: Daemon) -> None:
    body = await _signed(daemon)
    raw = bytes.fromhex(body["authPayload"]["signature"][2:])
    s = int.from_bytes(raw[32:64], "big")
    twin = raw[:32] + (N - s).to_bytes(32, "big") + bytes([55 - raw[64]])
    status, data = await daemon.post(_with_signature(body, twin))
    assert (status, data["error"]) == (400, "invalid_auth_payload"), data  # not a retryable 422


async def test_a_never_expiring_usdc_authorization_settles(daemon: Daemon) -> None:
    """validBefore = 2**256 - 1 is a valid EIP-3009 authorization; its expiry is stored capped."""
    payer = daemon.chain["payers"][1]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
    ch["typedData"]["message"]["validBefore"] = str(2**256 - 1)
    ch["actionsRetireRequest"]["authPayload"]["validBefore"] = str(2**256 - 1)
    body = copy.deepcopy(ch["actionsRetireRequest"])
    body["authPayload"]["signature"] = sign(ch["typedData"], payer["privateKey"])
    status, data = await daemon.post(body)
    assert (status, data["status"]) == (200, "settled"), data
    stored = await daemon.runtime.db.fetchval(
        "SELECT auth_expires_at FROM relay_jobs WHERE salt = $1", bytes.fromhex(body["salt"][2:])
    )
    assert stored == 2**63 - 1


async def test_kvcm_nonce_with_a_superscript_digit_is_invalid_auth_payload(daemon: Daemon) -> None:
    body = await _signed(daemon, 2, inputToken="kVCM")
    body["authPayload"]["nonce"] = "²"
    status, data = await daemon.post(body)
    assert (status, data["error"]) == (400, "invalid_auth_payload"), data


@pytest.mark.parametrize(
    "change",
    [
        lambda b: (b["authPayload"].pop("signature"), b.update(carbonClass="NOPE")),
        lambda b: (b["authPayload"].update(to=b["from"]), b.update(amount="100000")),
        lambda b: (b.pop("salt"), b.update(listingId="999", carbonClass=None)),
    ],
    ids=["no-signature+unknown-class", "wrong-to+huge-amount", "no-salt+unknown-listing"],
)
async def test_a_malformed_authorization_is_refused_before_any_lookup(daemon: Daemon, change: Any) -> None:
    """The shape of the authorization is checked first: a request that can never succeed
    is not told that supply or liquidity (retryable) is the problem."""
    body = await _signed(daemon)
    change(body)
    body = {k: v for k, v in body.items() if v is not None}
    status, data = await daemon.post(body)
    assert (status, data["error"]) == (400, "invalid_auth_payload"), data


async def test_bad_checksum_and_zero_address_as_from_are_4xx(daemon: Daemon) -> None:
    body = await _signed(daemon)
    good = body["from"]
    flipped = good[:-1] + (good[-1].lower() if good[-1].isupper() else good[-1].upper())
    if flipped == good:  # the last character is a digit: flip the first letter instead
        i = next(i for i, c in enumerate(good[2:], 2) if c.isalpha())
        flipped = good[:i] + good[i].swapcase() + good[i + 1 :]
    for address in (flipped, "0x" + "0" * 40):
        bad = copy.deepcopy(body)
        bad["from"] = bad["authPayload"]["from"] = address
        status, data = await daemon.post(bad)
        assert (status, data["error"]) == (400, "schema_validation"), (address, data)


@pytest.mark.timeout(300)
async def test_random_mutations_of_signed_requests_never_answer_5xx(daemon: Daemon) -> None:
    rng = random.Random(11)
    bodies = [await _signed(daemon, 0), await _signed(daemon, 2, inputToken="kVCM")]
    seen: dict[int, int] = {}
    for i in range(300):
        body = mutate_request(rng, bodies[i % 2])
        status, data = await daemon.post(body)
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, (body, data)
    assert seen.get(400, 0) > 100, seen
