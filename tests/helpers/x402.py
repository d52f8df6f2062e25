"""The standard x402 retirement resource's tests: a daemon with a treasury and a quote
secret, the ``actions/retire`` body, the 402's ``PAYMENT-REQUIRED``, and a
``PAYMENT-SIGNATURE`` signed exactly as the standard exact EVM client signs it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from web3 import Web3

from tests.chain_helpers import token_balance, transact_as
from tests.conftest import Daemon, free_port
from tests.private import daemon_settings, serving

SECRET = "test-quote-secret-" + "ab" * 16


@contextlib.asynccontextmanager
async def resource(
    info: dict[str, Any], dsn: str, *, workers: bool = True, **overrides: Any
) -> AsyncIterator[Daemon]:
    settings = daemon_settings(
        info,
        dsn,
        free_port(),
        treasury_private_key=info["treasury"]["privateKey"],
        x402_quote_secret=SECRET,
        **overrides,
    )
    async with serving(settings, info, workers=workers) as d:
        yield d


def payer_of(info: dict[str, Any], n: int) -> dict[str, str]:
    """A devnet payer (USDC, no ETH); the devnet has a few, so tests share them (their checks
    are deltas)."""
    payers: list[dict[str, str]] = info["payers"]
    return payers[n % len(payers)]


def retire_body(payer: str, **fields: Any) -> dict[str, Any]:
    body = {"carbonClass": "NBO", "amount": "1", "inputToken": "USDC", **fields}
    return {
        "action": "actions/retire",
        "from": payer,
        "details": {"beneficiaryIsPayer": True, "beneficiaryString": "x402 buyer"},
        **body,
    }


def decode(header: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(base64.b64decode(header, validate=True))
    return value


async def post(
    d: Daemon, body: dict[str, Any], signature: str | None = None
) -> tuple[int, dict[str, Any], Any]:
    headers = {} if signature is None else {"PAYMENT-SIGNATURE": signature}
    async with d.session.post(d.api, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None), r.headers


async def required(d: Daemon, body: dict[str, Any]) -> dict[str, Any]:
    status, data, headers = await post(d, body)
    assert status == 402 and data["error"] == "payment_required", data
    assert "PAYMENT-REQUIRED" in headers.get("Access-Control-Expose-Headers", "")
    return decode(headers["PAYMENT-REQUIRED"])


def sign_payload(
    pr: dict[str, Any],
    key: str,
    *,
    value: int | None = None,
    to: str | None = None,
    valid_before: int | None = None,
    **accepted: Any,
) -> str:
    """PAYMENT-SIGNATURE as the standard exact EVM client makes it for ``pr["accepts"][0]``
    (``validBefore`` now + ``maxTimeoutSeconds`` unless given)."""
    req = {**pr["accepts"][0], **accepted}
    account = Account.from_key(key)
    message = {
        "from": account.address,
        "to": Web3.to_checksum_address(to or req["payTo"]),
        "value": int(value if value is not None else req["amount"]),
        "validAfter": 0,
        "validBefore": valid_before or int(time.time()) + int(req["maxTimeoutSeconds"]),
        "nonce": os.urandom(32),
    }
    typed = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "TransferWithAuthorization": [
                {"name": "from", "type": "address"},
                {"name": "to", "type": "address"},
                {"name": "value", "type": "uint256"},
                {"name": "validAfter", "type": "uint256"},
                {"name": "validBefore", "type": "uint256"},
                {"name": "nonce", "type": "bytes32"},
            ],
        },
        "primaryType": "TransferWithAuthorization",
        "domain": {
            "name": req["extra"]["name"],
            "version": req["extra"]["version"],
            "chainId": int(req["network"].split(":")[1]),
            "verifyingContract": req["asset"],
        },
        "message": message,
    }
    signature = Account.sign_message(encode_typed_data(full_message=typed), key).signature
    authorization = {k: str(v) for k, v in message.items() if k not in ("nonce", "from", "to")}
    authorization.update(
        {"from": message["from"], "to": message["to"], "nonce": "0x" + bytes(message["nonce"]).hex()}
    )
    payload = {
        "x402Version": 2,
        "payload": {"authorization": authorization, "signature": "0x" + bytes(signature).hex()},
        "accepted": req,
        "resource": pr["resource"],
    }
    return base64.b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()


async def usdc(d: Daemon, owner: str) -> int:
    return await token_balance(d.runtime.node, "usdc", owner)


async def payments_of(d: Daemon, payer: str) -> list[Any]:
    return list(await d.runtime.db.fetch("SELECT * FROM x402_payments WHERE payer = $1", payer))


async def wait_state(d: Daemon, payment_id: str, states: set[str], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        row = await d.runtime.db.fetchrow("SELECT * FROM x402_payments WHERE id = $1::uuid", payment_id)
        if (row is not None and row["state"] in states) or time.monotonic() > deadline:
            assert row is not None and row["state"] in states, row
            return row
        await asyncio.sleep(0.2)


def nonce_of(header: str) -> bytes:
    """The EIP-3009 nonce of a ``PAYMENT-SIGNATURE``."""
    return bytes.fromhex(decode(header)["payload"]["authorization"]["nonce"][2:])


def submit_payload(chain: dict[str, Any], header: str) -> Any:
    """A front-runner's move: the deployer submits a ``PAYMENT-SIGNATURE``'s authorization to
    USDC itself (gas estimated first: one that would revert raises before anything is sent);
    the mined receipt."""
    a = decode(header)["payload"]
    auth, sig = a["authorization"], bytes.fromhex(a["signature"][2:])
    return transact_as(
        chain,
        "deployer",
        chain["contracts"]["usdc"],
        "UsdcEip3009",
        "transferWithAuthorization",
        auth["from"],
        auth["to"],
        int(auth["value"]),
        int(auth["validAfter"]),
        int(auth["validBefore"]),
        bytes.fromhex(auth["nonce"][2:]),
        sig[64],
        sig[:32],
        sig[32:64],
    )
