"""The gasless relay's requests as a payer makes them: the EIP-712 signature, the 402 challenge
of ``actions/retire``, the signed request built from it, a signed retirement of a devnet payer
in one call, an HTTP client of a daemon process, and random mutations of a request."""

from __future__ import annotations

import copy
import random
from typing import Any, Protocol

import aiohttp
from eth_account import Account
from eth_account.messages import encode_typed_data


class RelayApi(Protocol):
    """What these helpers need of a daemon: its devnet description (``chain``) and a JSON
    post to its ``/api`` answering (HTTP status, JSON body). The session daemon
    (:class:`tests.conftest.Daemon`) and :class:`ProcessClient` are both."""

    chain: dict[str, Any]

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]: ...


class ProcessClient:
    """An HTTP client of a daemon process at ``base`` (its ``/api``), on the devnet ``chain``
    (the same calls the session daemon's tests make)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, chain: dict[str, Any]) -> None:
        self.session, self.base, self.chain = session, base, chain

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with self.session.post(f"{self.base}/api", json=body) as r:
            return r.status, await r.json(content_type=None)


def sign(typed: dict[str, Any], key: str) -> str:
    """The EIP-712 signature of the typed data ``typed`` by the private key ``key`` (0x hex,
    65 bytes)."""
    return "0x" + bytes(Account.sign_message(encode_typed_data(full_message=typed), key).signature).hex()


async def challenge(d: RelayApi, payer: dict[str, str], **fields: Any) -> dict[str, Any]:
    """actions/retire from ``payer`` (its ``address``) without authPayload, with the body's
    ``fields`` (``carbonClass``, ``amount``, ``inputToken``, ...) -> the 402 body (asserted a
    402 ``payment_required`` of facilitator version 2)."""
    body = {
        "action": "actions/retire",
        "from": payer["address"],
        "details": {"beneficiaryIsPayer": True, "beneficiaryString": "Test beneficiary"},
        **fields,
    }
    status, data = await d.post(body)
    assert status == 402, data
    assert data["error"] == "payment_required"
    assert data["x402FacilitatorVersion"] == 2
    return data


def signed_request(ch: dict[str, Any], key: str) -> dict[str, Any]:
    """The challenge ``ch``'s ``actionsRetireRequest`` (a copy) with its ``typedData`` signed
    by ``key``: the body to post."""
    body: dict[str, Any] = copy.deepcopy(ch["actionsRetireRequest"])
    body["authPayload"]["signature"] = sign(ch["typedData"], key)
    return body


async def signed_retirement(d: RelayApi, payer: int, amount: str = "0.01") -> dict[str, Any]:
    """A signed request of devnet payer number ``payer`` retiring ``amount`` tonnes of class
    RE paid in USDC, ready to post."""
    who = d.chain["payers"][payer]
    ch = await challenge(d, who, carbonClass="RE", amount=amount, inputToken="USDC")
    return signed_request(ch, who["privateKey"])


def mutate_request(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """A copy of the request ``body`` with one field of it or of its ``authPayload`` (drawn
    by ``rng``) dropped or replaced by a hostile value (a wrong type, an out-of-range number,
    a malformed hex string, one character changed, a corrupted signature byte)."""
    out = copy.deepcopy(body)
    target = out if rng.random() < 0.5 else out["authPayload"]
    key = rng.choice(sorted(target))
    value = target[key]
    choices: list[Any] = [
        None,
        0,
        -1,
        2**256,
        2**256 - 1,
        2**63,
        "",
        "0",
        "²",
        "0x",
        "0x" + "00" * 32,
        "0x" + "ff" * 65,
        True,
        [],
        {},
        "1e3",
        " 1",
        "0x" + "0" * 40,
        1.5,
    ]
    if isinstance(value, str) and value:
        i = rng.randrange(len(value))
        choices += [
            value[:i] + rng.choice("0123456789abcdefABCDEFxX²") + value[i + 1 :],
            value[:i],
            value + "0",
        ]
    if isinstance(value, str) and value.startswith("0x") and len(value) == 132:
        raw = bytearray(bytes.fromhex(value[2:]))
        raw[rng.randrange(65)] = rng.randrange(256)
        choices.append("0x" + raw.hex())
    replacement = rng.choice(choices)
    if replacement is None:
        del target[key]
    else:
        target[key] = replacement
    return out
