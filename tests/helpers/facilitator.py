"""Builders and calls of the standard x402 facilitator's tests: a facilitator request body
signed as the SDK signs it, the HTTP call with a bearer key, a front-runner's direct
submission of a payload's authorization, a node that holds settles unmined, and the
hypothesis mutations of a body."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from hypothesis import strategies as st
from web3 import Web3

from relayer.chain import calls
from relayer.domain import eip712
from relayer.domain.chains import usdc_domain_name
from tests.conftest import Daemon

PAYER_INDEX = 2  # as test_transfers: its USDC is spare


def network(d: Daemon) -> str:
    return f"eip155:{d.chain['chainId']}"


def requirements(d: Daemon, pay_to: str, amount: int) -> dict[str, Any]:
    return {
        "scheme": "exact",
        "network": network(d),
        "asset": d.chain["contracts"]["usdc"],
        "amount": str(amount),
        "payTo": pay_to,
        "maxTimeoutSeconds": 300,
        "extra": {"name": usdc_domain_name(d.chain["chainId"]), "version": "2"},
    }


def payment(
    d: Daemon,
    pay_to: str,
    amount: int,
    *,
    value: int | None = None,
    to: str | None = None,
    valid_before: int | None = None,
    key: str | None = None,
    payer: str | None = None,
    nonce: str | None = None,
) -> dict[str, Any]:
    """A facilitator request body as the SDK sends it, signed by the payer (or by ``key``)."""
    who = d.chain["payers"][PAYER_INDEX]
    chain_id, usdc = d.chain["chainId"], d.chain["contracts"]["usdc"]
    auth = {
        "from": payer or who["address"],
        "to": to or pay_to,
        "value": str(amount if value is None else value),
        "validAfter": "0",
        "validBefore": str(valid_before or int(time.time()) + 300),
        "nonce": nonce or "0x" + os.urandom(32).hex(),
    }
    typed = eip712.transfer_with_authorization(
        chain_id=chain_id,
        usdc=usdc,
        payer=auth["from"],
        to=auth["to"],
        value=int(auth["value"]),
        valid_after=0,
        valid_before=int(auth["validBefore"]),
        nonce=bytes.fromhex(auth["nonce"][2:]),
        name=usdc_domain_name(chain_id),
        version="2",
    )
    signed = Account.sign_message(encode_typed_data(full_message=typed), key or who["privateKey"])
    req = requirements(d, pay_to, amount)
    return {
        "x402Version": 2,
        "paymentPayload": {
            "x402Version": 2,
            "payload": {"authorization": auth, "signature": "0x" + bytes(signed.signature).hex()},
            "accepted": req,
            "resource": {"url": "http://example.test/paid", "mimeType": "application/json"},
        },
        "paymentRequirements": req,
    }


async def call(d: Daemon, path: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with d.session.post(f"{d.base_url}/facilitator/{path}", json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


def fresh_address() -> str:
    return str(Account.create().address)


@contextlib.contextmanager
def held_unmined(d: Daemon, wait_s: float) -> Iterator[Web3]:
    """Automine off and the facilitator's settle wait at ``wait_s`` (so a settle answers
    ``settlement_pending``), both restored on exit; yields the node (``evm_mine`` mines)."""
    w3 = Web3(Web3.HTTPProvider(d.chain["rpcUrl"]))
    facilitator = d.runtime.facilitator
    wait, facilitator.settle_wait_s = facilitator.settle_wait_s, wait_s
    w3.provider.make_request("evm_setAutomine", [False])  # type: ignore[arg-type]
    try:
        yield w3
    finally:
        w3.provider.make_request("evm_setAutomine", [True])  # type: ignore[arg-type]
        facilitator.settle_wait_s = wait


JSON_VALUES: Any = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**300), max_value=2**300)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
    | st.sampled_from(["0x", "0x" + "f" * 64, "0x" + "1" * 40, "9" * 80, str(2**256), "-1", "1e3"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=6,
)


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside ``value`` (dict keys and list indexes)."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(json_paths(v, (*prefix, k)))
    return out


def mutate(body: dict[str, Any], draw: Callable[[Any], Any]) -> dict[str, Any]:
    """``body`` with one to three mutations: a value replaced, a key dropped or one added."""
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(json_paths(body)))
        parent: Any = body
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(JSON_VALUES)
        elif action == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(JSON_VALUES)
    return body


def submit_directly(d: Daemon, body: dict[str, Any]) -> bytes:
    """Send the payload's authorization to USDC ourselves, as a front-runner would (the
    deployer pays the gas): the hash of its transaction, mined (anvil automines)."""
    auth, signature = (
        body["paymentPayload"]["payload"]["authorization"],
        body["paymentPayload"]["payload"]["signature"],
    )
    data = calls.transfer_with_authorization(
        auth["from"],
        auth["to"],
        int(auth["value"]),
        int(auth["validAfter"]),
        int(auth["validBefore"]),
        bytes.fromhex(auth["nonce"][2:]),
        eip712.parse_signature(bytes.fromhex(signature[2:])),
    )
    w3 = Web3(Web3.HTTPProvider(d.chain["rpcUrl"]))
    copier = Account.from_key(d.chain["deployer"]["privateKey"])
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])  # type: ignore[arg-type]
    tx = {
        "type": 2,
        "chainId": d.chain["chainId"],
        "to": d.chain["contracts"]["usdc"],
        "data": data,
        "value": 0,
        "gas": 200_000,
        "nonce": w3.eth.get_transaction_count(copier.address, "pending"),
        "maxFeePerGas": 2 * base_fee + 1,
        "maxPriorityFeePerGas": 0,
    }
    sent = w3.eth.send_raw_transaction(copier.sign_transaction(tx).raw_transaction)
    assert w3.eth.wait_for_transaction_receipt(sent, timeout=30)["status"] == 1
    return bytes(sent)
